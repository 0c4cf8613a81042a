"""Claims and liveness every host sees (``core.worker_claims``): a cluster's claim of a
broker row is recorded in the statement that claims it and forgotten on acknowledgement;
a cluster that stopped beating is dead, and any supervisor's sweep hands back the rows
it claimed that still hold its lock value, then removes its records; a live cluster's
claims stay; a second sweep changes nothing. The real processes: ``test_many_hosts``."""

from __future__ import annotations

import socket
import uuid
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from core.models import WorkerClaim, WorkerCluster
from core.qcluster import _tracked_broker, sweep_stale_states
from core.worker_claims import (
    CLUSTER_BEAT_SECONDS,
    CLUSTER_DEAD_SECONDS,
    CLUSTER_ENV,
    CLUSTER_SWEEP_SECONDS,
    cluster_name,
    dead_worker_clusters_sweep,
    worker_claims,
    worker_claims_release,
    worker_cluster_beat,
    worker_clusters,
)

pytestmark = pytest.mark.django_db


def _queue(broker, count: int) -> list[int]:
    ids = []
    for n in range(count):
        task = {"id": uuid.uuid4().hex, "name": f"t{n}", "func": "time.sleep", "args": (0,),
                "kwargs": {}, "started": timezone.now()}  # fmt: skip
        ids.append(broker.enqueue(SignedPackage.dumps(task)))
    return ids


def _broker(monkeypatch, cluster: str | None):
    if cluster is None:
        monkeypatch.delenv(CLUSTER_ENV, raising=False)
    else:
        monkeypatch.setenv(CLUSTER_ENV, cluster)
    return _tracked_broker()


def _locks() -> dict[int, object]:
    return dict(OrmQ.objects.values_list("pk", "lock"))


def _claims() -> set[tuple[str, int, object]]:
    return set(WorkerClaim.objects.values_list("cluster_id", "task_id", "lock"))


def _age(name: str, seconds: float) -> None:
    WorkerCluster.objects.filter(name=name).update(beat_at=Now() - timedelta(seconds=seconds))


def test_the_constants_leave_room_for_slow_beats():
    assert CLUSTER_DEAD_SECONDS >= 6 * CLUSTER_BEAT_SECONDS
    assert CLUSTER_SWEEP_SECONDS < CLUSTER_DEAD_SECONDS


def test_a_claim_is_recorded_with_its_lock_and_forgotten_on_acknowledgement(monkeypatch):
    worker_cluster_beat(name="h1:a")
    broker = _broker(monkeypatch, "h1:a")
    ids = _queue(broker, 3)
    claimed = [broker.dequeue() for _ in ids]  # the cluster's pusher's call
    assert [pk for ((pk, _),) in claimed] == ids
    locks = _locks()
    assert all(lock > timezone.now() for lock in locks.values())
    assert _claims() == {("h1:a", pk, locks[pk]) for pk in ids}
    assert worker_claims(cluster="h1:a") == {pk: locks[pk] for pk in ids}

    broker.acknowledge(ids[0])
    assert sorted(_locks()) == ids[1:]
    assert _claims() == {("h1:a", pk, locks[pk]) for pk in ids[1:]}


def test_a_row_another_cluster_took_is_not_claimed_nor_recorded(monkeypatch):
    worker_cluster_beat(name="h1:a")
    worker_cluster_beat(name="h2:b")
    first = _broker(monkeypatch, "h1:a")
    (pk,) = _queue(first, 1)
    row = OrmQ.objects.get(pk=pk)  # as both clusters read it
    assert first.claim(row) is True
    after_first = _locks()
    second = _broker(monkeypatch, "h2:b")
    assert second.claim(row) is False
    assert _locks() == after_first
    assert _claims() == {("h1:a", pk, after_first[pk])}


def test_an_unregistered_cluster_claims_nothing(monkeypatch):
    """A cluster a sweep took for dead claims nothing until its supervisor's next beat
    registers it again."""
    broker = _broker(monkeypatch, "h1:gone")
    (pk,) = _queue(broker, 1)
    before = _locks()
    assert broker.claim(OrmQ.objects.get(pk=pk)) is False
    assert _locks() == before and _claims() == set()
    worker_cluster_beat(name="h1:gone")
    assert broker.claim(OrmQ.objects.get(pk=pk)) is True
    assert _claims() == {("h1:gone", pk, _locks()[pk])}


def test_a_cluster_started_without_a_supervisor_claims_as_the_fair_broker(monkeypatch):
    broker = _broker(monkeypatch, None)
    (pk,) = _queue(broker, 1)
    assert broker.claim(OrmQ.objects.get(pk=pk)) is True
    assert _locks()[pk] > timezone.now() and _claims() == set()


def test_the_sweep_hands_back_a_dead_clusters_rows_that_still_hold_its_lock(monkeypatch):
    for name in ("h1:live", "h2:dead"):
        worker_cluster_beat(name=name)
    live, dead = _broker(monkeypatch, "h1:live"), _broker(monkeypatch, "h2:dead")
    ids = _queue(live, 5)
    for pk in ids[:2]:
        assert live.claim(OrmQ.objects.get(pk=pk))
    for pk in ids[2:]:
        assert dead.claim(OrmQ.objects.get(pk=pk))
    # ids[3]: handed back by the dead cluster's own host, then claimed by the live one
    worker_claims_release(cluster="h2:dead", only={ids[3]})
    assert live.claim(OrmQ.objects.get(pk=ids[3]))
    # ids[4]: acknowledged (gone) before the record could be deleted: a kill in between
    OrmQ.objects.filter(pk=ids[4]).delete()
    locks = _locks()
    claims = _claims()
    assert {c[:2] for c in claims} == {
        ("h1:live", ids[0]), ("h1:live", ids[1]), ("h1:live", ids[3]),
        ("h2:dead", ids[2]), ("h2:dead", ids[4]),
    }  # fmt: skip

    _age("h1:live", CLUSTER_DEAD_SECONDS - 10)  # slow, not dead
    assert dead_worker_clusters_sweep() == {}
    assert _locks() == locks and _claims() == claims

    _age("h2:dead", CLUSTER_DEAD_SECONDS + 1)
    before = timezone.now()
    assert dead_worker_clusters_sweep() == {"h2:dead": 1}
    after = _locks()
    assert before <= after[ids[2]] <= timezone.now()  # ready again, now
    assert {pk: after[pk] for pk in (ids[0], ids[1], ids[3])} == {
        pk: locks[pk] for pk in (ids[0], ids[1], ids[3])
    }  # the live cluster's claims, ids[3] too, untouched
    assert ids[4] not in after
    assert _claims() == {c for c in claims if c[0] == "h1:live"}
    assert list(WorkerCluster.objects.values_list("name", flat=True)) == ["h1:live"]

    # twice: nothing more
    assert dead_worker_clusters_sweep() == {}
    assert _locks() == after and _claims() == {c for c in claims if c[0] == "h1:live"}


def test_a_cluster_taken_for_dead_registers_again_at_its_next_beat():
    worker_cluster_beat(name="h1:a")
    _age("h1:a", CLUSTER_DEAD_SECONDS + 1)
    assert dead_worker_clusters_sweep() == {"h1:a": 0}
    assert WorkerCluster.objects.count() == 0
    worker_cluster_beat(name="h1:a")
    (beat,) = WorkerCluster.objects.values_list("beat_at", flat=True)
    assert abs((timezone.now() - beat).total_seconds()) < 5
    assert dead_worker_clusters_sweep() == {}
    assert WorkerCluster.objects.count() == 1


def test_a_killed_supervisors_state_on_this_host_is_swept_at_once(monkeypatch, tmp_path):
    """The next supervisor started on the host hands back its dead predecessor's claims
    without waiting for it to count as dead (no supervisor holds the state's lock)."""
    state = tmp_path / "qcluster-100-abc"
    state.mkdir()
    name = cluster_name(state)
    worker_cluster_beat(name=name)
    broker = _broker(monkeypatch, name)
    (pk,) = _queue(broker, 1)
    assert broker.claim(OrmQ.objects.get(pk=pk))
    sweep_stale_states(tmp_path)
    assert _locks()[pk] <= timezone.now()
    assert _claims() == set() and WorkerCluster.objects.count() == 0
    assert not state.exists()


def test_healthz_lists_the_registered_clusters_alive_and_dead(monkeypatch):
    from core import health

    for name in ("h1:a", "h2:b"):
        worker_cluster_beat(name=name)
    broker = _broker(monkeypatch, "h2:b")
    for pk in _queue(broker, 2):
        assert broker.claim(OrmQ.objects.get(pk=pk))
    _age("h2:b", CLUSTER_DEAD_SECONDS + 5)
    listed = health.worker_status()["registered"]
    assert listed == worker_clusters()
    assert [(c["name"], c["claimed"], c["alive"]) for c in listed] == [
        ("h1:a", 0, True), ("h2:b", 2, False)
    ]  # fmt: skip
    assert {c["host"] for c in listed} == {socket.gethostname()}
    assert listed[0]["beat_seconds_ago"] < 5
    assert CLUSTER_DEAD_SECONDS + 5 <= listed[1]["beat_seconds_ago"] < CLUSTER_DEAD_SECONDS + 10
    dead_worker_clusters_sweep()
    assert [c["name"] for c in health.worker_status()["registered"]] == ["h1:a"]
