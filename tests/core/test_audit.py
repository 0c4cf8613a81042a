"""The audit trail of access (issue 30, item 3): keys created and revoked and every
erasure are recorded with who acted, the key it used, its address and when, and
never with memory content, a scope's path or an end user's id."""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from core.db_backend.base import table_owner
from core.models import AccessEvent, APIKey
from core.services import api_key_create
from memories.bases.services import session_messages_delete
from memories.conversations.models import Message
from memories.facts.models import Fact, FactLink, Scope
from memories.facts.scopes import end_user_ensure, scope_ensure
from memories.facts.services import FactIn, fact_add, scope_erase
from tests.conftest import record

pytestmark = pytest.mark.django_db
SECRET = "User's passport number is X1234567"


def _events(owner) -> list[tuple]:
    return list(
        AccessEvent.objects.filter(owner=owner)
        .order_by("id")
        .values_list("action", "actor", "key_id", "subject_key_id", "address")
    )


def _acting_key(owner) -> APIKey:
    return APIKey.objects.filter(owner=owner).order_by("id").first()


def test_keys_created_and_revoked_through_the_api_name_the_key_that_acted(alice, alice_client):
    acting = _acting_key(alice)
    AccessEvent.objects.all().delete()  # (the fixture's own key: the next test)
    created = alice_client.post("/api/v1/api-keys", {"name": "extension"}, format="json")
    assert created.status_code == 201
    new = created.json()["id"]
    assert alice_client.delete(f"/api/v1/api-keys/{new}").status_code == 200
    assert alice_client.delete(f"/api/v1/api-keys/{new}").status_code == 200  # again: no record
    who = f"key:{acting.prefix}"
    assert _events(alice) == [
        ("key_created", who, acting.pk, new, "127.0.0.1"),
        ("key_revoked", who, acting.pk, new, "127.0.0.1"),
    ]


def test_a_key_made_by_a_command_or_by_the_service(alice, bob):
    call_command("create_api_key", "bob", "--name", "cli", stdout=StringIO())
    api_key_create(owner=alice, name="in process")
    (by_command,) = _events(bob)
    assert by_command[:3] == ("key_created", "command", None) and by_command[4] is None
    assert _events(alice)[-1][:3] == ("key_created", "service", None)


def test_erasures_are_recorded_without_content(alice, bob, alice_client, bob_client):
    end_user = end_user_ensure(owner=alice, external_id="erin@example.com")
    fact_add(owner=alice, scope=end_user, facts=[FactIn(SECRET)], reason="seed")
    org = scope_ensure(owner=alice, scope=("org", "acme"))
    fact_add(owner=alice, scope=org, facts=[FactIn("The org ships on Fridays")], reason="seed")
    AccessEvent.objects.all().delete()
    # Refused requests record nothing: another owner's end user, an unknown scope.
    assert bob_client.delete("/api/v1/users/erin@example.com/memories").status_code == 404
    refused = bob_client.post("/api/v1/engine/erase", {"scope": ["org", "acme"]}, format="json")
    assert refused.status_code == 404
    assert AccessEvent.objects.count() == 0 and Fact.objects.count() == 2

    assert alice_client.delete("/api/v1/users/erin@example.com/memories").status_code == 200
    erased = alice_client.post("/api/v1/engine/erase", {"scope": ["org", "acme"]}, format="json")
    assert erased.status_code == 200
    key = _acting_key(alice)
    events = list(AccessEvent.objects.filter(owner=alice).order_by("id"))
    assert [(e.action, e.actor, e.key_id, e.address) for e in events] == [
        ("erasure", f"key:{key.prefix}", key.pk, "127.0.0.1"),
        ("erasure", f"key:{key.prefix}", key.pk, "127.0.0.1"),
    ]
    assert [e.detail["scope_kind"] for e in events] == ["user", "scope"]
    assert events[0].detail["counts"]["facts"] == 1
    stored = json.dumps([e.detail for e in events])
    assert "erin" not in stored and "passport" not in stored and "acme" not in stored
    assert not Scope.objects.filter(owner=alice, external_id="erin@example.com").exists()


def test_a_sessions_erasure_is_recorded(alice, alice_client, flow):
    record(flow, "s1", "one", "two")
    AccessEvent.objects.all().delete()
    deleted = alice_client.delete(f"/api/v1/flows/{flow.pk}/sessions/s1/messages")
    assert deleted.status_code == 200
    (event,) = AccessEvent.objects.filter(owner=alice)
    assert (event.action, event.detail) == (
        "erasure", {"scope_kind": "session", "counts": {"messages": 2}},
    )  # fmt: skip
    assert "s1" not in json.dumps(event.detail)


def test_an_erasure_whose_record_fails_erases_nothing(alice, flow, monkeypatch):
    record(flow, "s1", "one", "two")
    end_user = end_user_ensure(owner=alice, external_id="u1")
    fact_add(owner=alice, scope=end_user, facts=[FactIn("User likes tea")], reason="seed")
    AccessEvent.objects.all().delete()

    def refused(**_: object) -> None:
        raise RuntimeError("the audit trail is unavailable")

    monkeypatch.setattr("memories.bases.services.access_record", refused)
    monkeypatch.setattr("memories.facts.services.access_record", refused)
    with pytest.raises(RuntimeError):
        session_messages_delete(flow=flow, session_id="s1")
    with pytest.raises(RuntimeError):
        scope_erase(scope=end_user)
    assert Message.objects.filter(flow=flow, session_id="s1").count() == 2
    assert Scope.objects.filter(pk=end_user.pk).exists() and Fact.objects.count() == 1
    assert AccessEvent.objects.count() == 0


def test_the_admin_records_its_user_and_lists_the_trail(alice, admin_client, admin_user):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    fact_add(owner=alice, scope=end_user, facts=[FactIn("User likes tea")], reason="seed")
    AccessEvent.objects.all().delete()
    response = admin_client.post(
        "/admin/memories/scope/",
        {"action": "erase", "_selected_action": [end_user.pk], "confirmed": "yes"},  # fmt: skip
    )
    assert response.status_code == 302
    (event,) = AccessEvent.objects.all()
    assert (event.action, event.actor, event.key_id, event.address) == (
        "erasure", f"admin:{admin_user.username}", None, "127.0.0.1",
    )  # fmt: skip
    page = admin_client.get("/admin/core/accessevent/")
    assert page.status_code == 200
    assert f"admin:{admin_user.username}" in page.content.decode()
    assert admin_client.get(f"/admin/core/accessevent/{event.pk}/delete/").status_code == 403


def test_the_admin_erases_scopes_once_each_and_never_deletes_one(alice, admin_client, admin_user):
    users = [end_user_ensure(owner=alice, external_id=name) for name in ("u1", "u2")]
    for user in users:
        fact_add(owner=alice, scope=user, facts=[FactIn(f"{SECRET} ({user.pk})")], reason="seed")
    AccessEvent.objects.all().delete()
    # Django's own delete (the change page's button, a crafted POST) is refused: it would
    # take the scope without its facts, chats and engine data, and without an event.
    delete_url = f"/admin/memories/scope/{users[0].pk}/delete/"
    assert admin_client.get(delete_url).status_code == 403
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    refused = admin_client.post("/admin/memories/scope/", {
        "action": "delete_selected", "_selected_action": [users[0].pk], "post": "yes",
    })  # fmt: skip
    assert refused.status_code == 302  # back to the list: no such action
    assert Scope.objects.filter(owner=alice).count() == 2 and FactLink.objects.count() == 2
    assert AccessEvent.objects.count() == 0

    erased = admin_client.post("/admin/memories/scope/", {
        "action": "erase", "_selected_action": [u.pk for u in users], "confirmed": "yes",
    })  # fmt: skip
    assert erased.status_code == 302
    assert not Scope.objects.filter(owner=alice).exists() and Fact.objects.count() == 0
    assert sorted(
        AccessEvent.objects.values_list("owner", "action", "actor", "key", "address", "detail")
    ) == [(alice.pk, "erasure", f"admin:{admin_user.username}", None, "127.0.0.1", {
        "scope_kind": "user", "counts": {"facts": 1, "versions": 0, "changes": 1, "chats": 0},
    })] * 2  # fmt: skip


# --- the records of the facts room's own table, copied (core 0012) ------------------------
COPY = importlib.import_module("core.migrations.0012_scope_erasures_to_access_events")
T0 = datetime(2026, 11, 27, 1, 0, tzinfo=UTC)
MS = timedelta(milliseconds=1)
FIELDS = ("owner", "action", "actor", "key", "subject_key", "address", "detail", "at")


@pytest.fixture(scope="module")
def before_copy():
    """The models as core 0012 finds them (``memories.ScopeErasure`` among them)."""
    node = ("core", "0012_scope_erasures_to_access_events")
    return MigrationLoader(None, ignore_no_migrations=True).project_state(node, at_end=False).apps


@pytest.fixture
def scope_erasures(before_copy):
    """``add(owner, actor, kind, counts, at)``: a record in the facts room's table, made
    again for the test, which runs as the tables' owner (as migrations do; the table
    is dropped after it)."""
    model = before_copy.get_model("memories", "ScopeErasure")

    def add(owner, actor: str, kind: str, counts: dict, at: datetime) -> None:
        row = model.objects.create(owner_id=owner.pk, actor=actor, scope_kind=kind, counts=counts)
        model.objects.filter(pk=row.pk).update(erased_at=at)

    with table_owner(connection):
        with connection.schema_editor() as editor:
            editor.create_model(model)
        try:
            yield add
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(model)


def _copy(before_copy) -> list[tuple]:
    COPY.copy_erasures(before_copy, None)
    return list(AccessEvent.objects.order_by("at", "id").values_list(*FIELDS))


def _event(owner, actor: str, kind: str, counts: dict, at: datetime, **more) -> AccessEvent:
    event = AccessEvent.objects.create(owner=owner, action="erasure", actor=actor,
                                       detail={"scope_kind": kind, "counts": counts}, **more)  # fmt: skip
    AccessEvent.objects.filter(pk=event.pk).update(at=at)
    return event


@pytest.mark.django_db(transaction=True)
def test_each_erasure_recorded_by_the_facts_room_is_copied_once(
    alice, bob, before_copy, scope_erasures
):
    key, _ = api_key_create(owner=alice, name="app")
    AccessEvent.objects.all().delete()
    one = {"facts": 2, "versions": 1, "changes": 3, "chats": 0}
    two = {"facts": 5, "versions": 0, "changes": 5, "chats": 1}
    session = {"messages": 4}
    # Before the audit trail (core 0006): a record alone.
    scope_erasures(alice, "admin:root", "user", one, T0)
    scope_erasures(bob, "service", "global", one, T0)
    # An event alike in all but its actor, a millisecond after: another erasure.
    _event(alice, f"key:{key.prefix}", "user", one, T0 + MS, key=key)
    # Since then: each erasure both ways in one transaction, the event a few ms later;
    # the first of two alike erasures two seconds apart had no event of its own.
    scope_erasures(alice, "api", "scope", two, T0 + timedelta(hours=1))
    scope_erasures(alice, "api", "scope", two, T0 + timedelta(hours=1, seconds=2))
    _event(alice, f"key:{key.prefix}", "scope", two, T0 + timedelta(hours=1, seconds=2) + 3 * MS,
           key=key, address="203.0.113.7")  # fmt: skip
    _event(alice, f"key:{key.prefix}", "session", session, T0 + timedelta(hours=2), key=key)

    copied = _copy(before_copy)

    assert copied == [
        (alice.pk, "erasure", "admin:root", None, None, None,
         {"scope_kind": "user", "counts": one}, T0),
        (bob.pk, "erasure", "service", None, None, None,
         {"scope_kind": "global", "counts": one}, T0),
        (alice.pk, "erasure", f"key:{key.prefix}", key.pk, None, None,
         {"scope_kind": "user", "counts": one}, T0 + MS),
        (alice.pk, "erasure", "api", None, None, None,
         {"scope_kind": "scope", "counts": two}, T0 + timedelta(hours=1)),
        (alice.pk, "erasure", f"key:{key.prefix}", key.pk, None, "203.0.113.7",
         {"scope_kind": "scope", "counts": two}, T0 + timedelta(hours=1, seconds=2) + 3 * MS),
        (alice.pk, "erasure", f"key:{key.prefix}", key.pk, None, None,
         {"scope_kind": "session", "counts": session}, T0 + timedelta(hours=2)),
    ]  # fmt: skip
    # Run again: nothing more; over rows copied and a record made since: that one alone.
    assert _copy(before_copy) == copied
    scope_erasures(bob, "api", "user", two, T0 + timedelta(hours=3))
    assert _copy(before_copy) == [*copied, (
        bob.pk, "erasure", "api", None, None, None,
        {"scope_kind": "user", "counts": two}, T0 + timedelta(hours=3),
    )]  # fmt: skip


def test_the_facts_rooms_table_goes_after_its_records_are_copied():
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    remove = graph.node_map[("memories", "0021_delete_scopeerasure")]
    assert ("core", "0012_scope_erasures_to_access_events") in {p.key for p in remove.parents}
    assert "memories_scopeerasure" not in connection.introspection.table_names()
