"""Formation health: per owner, the share of update runs of the last 24 hours that were
malformed or failed and the time since a fact was last learned; on /healthz (a key: its
owner only; a staff session: every owner; anyone else: none of it) and the admin index."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from memories.engine.health import formation_health
from memories.engine.models import FormationRun
from memories.facts.scopes import scope_ensure
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _run(owner, status: str, *, ago: timedelta, learned: int = 0) -> None:
    scope = scope_ensure(owner=owner, scope=("user", "u1"))
    FormationRun.objects.create(owner=owner, scope=scope, batch_id=uuid.uuid4(), status=status,
                                updates=1, facts_learned=learned,
                                created_at=timezone.now() - ago)  # fmt: skip


@pytest.fixture
def runs(alice, bob):
    _run(alice, "done", ago=timedelta(hours=2), learned=2)
    _run(alice, "malformed", ago=timedelta(hours=1))
    _run(alice, "failed", ago=timedelta(minutes=30))
    _run(alice, "done", ago=timedelta(minutes=10))  # learned nothing
    _run(alice, "malformed", ago=timedelta(hours=30))  # outside the window
    _run(bob, "malformed", ago=timedelta(minutes=5))
    _run(bob, "malformed", ago=timedelta(minutes=4))


def _alice() -> dict:
    return {"owner": "alice", "runs_24h": 4, "malformed_24h": 1, "failed_24h": 1,
            "bad_share_24h": 0.5, "status": "degraded"}  # fmt: skip


BOB = {"owner": "bob", "runs_24h": 2, "malformed_24h": 2, "failed_24h": 0, "bad_share_24h": 1.0,
       "last_fact_learned_at": None, "seconds_since_last_fact": None, "status": "failing"}  # fmt: skip


def _without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("last_fact_learned_at",
                                                      "seconds_since_last_fact")} for r in rows]  # fmt: skip


def test_per_owner_share_of_bad_runs_and_time_since_the_last_fact(runs, alice):
    rows = formation_health()
    assert _without_times(rows) == [_alice(), _without_times([BOB])[0]]
    assert rows[1] == BOB
    assert 7190 <= rows[0]["seconds_since_last_fact"] <= 7260  # the done run 2 h ago
    learned_at = timezone.datetime.fromisoformat(rows[0]["last_fact_learned_at"])
    assert learned_at == FormationRun.objects.get(facts_learned=2).created_at


def test_an_owner_without_runs_is_idle_and_one_asked_for_is_listed(runs):
    carol = UserFactory(username="carol")
    assert formation_health(owner_ids=[carol.pk]) == [{
        "owner": "carol", "runs_24h": 0, "malformed_24h": 0, "failed_24h": 0,
        "bad_share_24h": None, "last_fact_learned_at": None, "seconds_since_last_fact": None,
        "status": "idle"}]  # fmt: skip


def test_healthz_shows_a_key_its_own_owner_only(runs, alice_client, bob_client, client):
    assert _without_times(alice_client.get("/healthz").json()["formation"]) == [_alice()]
    assert bob_client.get("/healthz").json()["formation"] == [BOB]
    assert "formation" not in client.get("/healthz").json()  # anonymous: statuses only


def test_healthz_and_the_admin_index_show_staff_every_owner(runs, client):
    staff = UserFactory(username="operator", is_staff=True, is_superuser=True)
    client.force_login(staff)
    assert _without_times(client.get("/healthz").json()["formation"]) == [
        _alice(),
        _without_times([BOB])[0],
    ]
    page = client.get("/admin/").content.decode()
    assert "Memory formation, last 24 hours" in page
    assert '<tr class="formation-failing"><th scope="row">bob</th><td>failing</td>' in page
    assert "<td>2</td><td>2</td><td>0</td>" in page and "100%" in page and "50%" in page
