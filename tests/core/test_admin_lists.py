"""The admin's lists as an operator reads them (the admin audit's low findings): a scope
found by the path the lists show, a stable order to page through, owners named by
username, help text that shows what it says."""

from __future__ import annotations

import pytest
from django.urls import reverse

from core.audit import access_record
from core.models import AccessEvent, UsageBudget
from memories.engine.models import EngineSettings
from memories.facts.scopes import scope_ensure
from memories.facts.services import FactIn, fact_add
from memories.stores.services import memory_store_create

pytestmark = pytest.mark.django_db


def _listed(admin_client, name: str, q: str) -> list:
    response = admin_client.get(reverse(f"admin:{name}_changelist"), {"q": q})
    assert response.status_code == 200
    return list(response.context["cl"].result_list)


def test_a_scope_is_found_by_the_path_the_lists_show(admin_client, alice, bob):
    """Searching ``user/ann`` (as every list writes a scope) found nothing: only the
    bare id ``ann`` did."""
    ann = scope_ensure(owner=alice, scope=["user", "ann"])
    scope_ensure(owner=alice, scope=["user", "annie"])
    scope_ensure(owner=alice, scope=["org", "ann"])
    bobs = scope_ensure(owner=bob, scope=["user", "ann"])
    fact_add(owner=alice, scope=["user", "ann"], facts=[FactIn(content="Ann likes tea")])
    fact_add(owner=alice, scope=["user", "annie"], facts=[FactIn(content="Annie likes rum")])
    assert {s.pk for s in _listed(admin_client, "memories_scope", "user/ann")} == {ann.pk, bobs.pk}
    assert {s.pk for s in _listed(admin_client, "memory_engine_scopejournal", "user/ann")} == {
        ann.pk, bobs.pk,
    }  # fmt: skip
    facts = _listed(admin_client, "memory_engine_enginefact", "user/ann")
    assert [f.content for f in facts] == ["Ann likes tea"]
    changes = _listed(admin_client, "memories_factchange", "user/ann")
    assert [c.new_content for c in changes] == ["Ann likes tea"]
    # the fields searched before still are
    assert {s.pk for s in _listed(admin_client, "memories_scope", "annie")} == {
        s.pk for s in _listed(admin_client, "memories_scope", "user/annie")
    }  # fmt: skip
    assert _listed(admin_client, "memories_scope", "user/nobody") == []


def test_stores_and_scopes_come_in_a_stable_order(admin_client, alice, bob):
    for owner, name in [(bob, "alpha"), (alice, "zulu"), (alice, "bravo"), (bob, "able")]:
        memory_store_create(owner=owner, name=name, type="simple", config={})
    stores = _listed(admin_client, "memory_stores_memorystore", "")
    assert [(s.owner.username, s.name) for s in stores] == [
        ("alice", "bravo"), ("alice", "zulu"), ("bob", "able"), ("bob", "alpha"),
    ]  # fmt: skip
    for owner, path in [(bob, ["user", "a"]), (alice, ["user", "z"]), (alice, ["org", "x"])]:
        scope_ensure(owner=owner, scope=path)
    scopes = _listed(admin_client, "memories_scope", "")
    assert [(s.owner.username, s.path) for s in scopes] == [
        ("alice", ["org", "x"]), ("alice", ["user", "z"]), ("bob", ["user", "a"]),
    ]  # fmt: skip


def test_rows_keyed_by_owner_are_named_by_username(admin_client, alice):
    """Messages and confirmation pages said "budget of 3"."""
    budget = UsageBudget.objects.create(owner=alice, daily_tokens=1000)
    settings_row = EngineSettings.objects.create(owner=alice)
    assert (str(budget), str(settings_row)) == ("budget of alice", "engine settings of alice")
    page = admin_client.get(reverse("admin:core_usagebudget_change", args=[budget.pk]))
    assert "budget of alice" in page.content.decode()


def test_the_actor_help_text_shows_its_placeholders(admin_client, alice):
    """``key:<prefix>`` was read as HTML: the page showed "key:, admin:, ..."."""
    event = access_record(owner_id=alice.pk, action="key.create")
    page = admin_client.get(reverse("admin:core_accessevent_change", args=[event.pk]))
    assert "key:PREFIX, admin:USERNAME, ..." in page.content.decode()
    assert AccessEvent.objects.count() == 1
