"""The audit trail of access (issue 30, item 3): keys created and revoked and every
erasure are recorded with who acted, the key it used, its address and when, and
never with memory content, a scope's path or an end user's id."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from core.models import AccessEvent, APIKey
from core.services import api_key_create
from memories.facts.models import Fact, Scope
from memories.facts.scopes import end_user_ensure, scope_ensure
from memories.facts.services import FactIn, fact_add
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
