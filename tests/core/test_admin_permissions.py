"""The admin follows Django's permissions and the service's rules (an operator's audit):
a staff account that may only view runs no action that changes or deletes; an owner is
fixed once a row exists (a budget or engine settings row keyed by its owner was
overwritten with another owner's values, a flow moved away from its memory bases); and
Django's delete is not offered where it would skip the service's own deletion (an
erasure's purge and event, a key's revocation, a base's counters)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import Client

from core.models import APIKey, UsageBudget
from core.services import api_key_create
from knowledge.models import Chunk, KnowledgeBase
from memories.bases.models import MemoryBase
from memories.conversations.models import Flow, Message
from memories.engine.models import EngineSettings
from memories.facts.models import Scope
from memories.facts.scopes import end_user_ensure
from tests.conftest import record
from tests.knowledge.factories import ingest, make_kb

pytestmark = pytest.mark.django_db


def test_every_admin_action_asks_for_more_than_view():
    """Each action a model admin offers declares the permissions it needs, never view
    alone (Django offers an action without ``permissions`` to every staff account that
    can see the list)."""
    bare = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label in ("auth", "django_q"):
            continue
        for name in model_admin.actions or ():
            action = getattr(model_admin, name) if isinstance(name, str) else name
            needs = set(getattr(action, "allowed_permissions", ()))
            if not needs or needs == {"view"}:
                bare.append(f"{model._meta.label}.{getattr(action, '__name__', name)}")
    assert bare == []


@pytest.fixture
def viewer(db) -> Client:
    user = User.objects.create_user("viewer", password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    client = Client()
    client.force_login(user)
    return client


def test_a_view_only_account_runs_no_action(viewer, alice, memory_base):
    scope = end_user_ensure(owner=alice, external_id="victim")
    key, _ = api_key_create(owner=alice, name="kept")
    kb = make_kb(alice, name="kept-kb")
    runs = [
        ("memories/scope", "erase", scope.pk),
        ("core/apikey", "revoke_keys", key.pk),
        ("knowledge/knowledgebase", "delete_with_chunks", kb.pk),
        ("memory_bases/memorybase", "delete_with_knowledge_base", memory_base.pk),
        ("memory_bases/memorybase", "regenerate", memory_base.pk),
    ]
    for path, action, pk in runs:
        listing = viewer.get(f"/admin/{path}/")
        assert listing.status_code == 200
        assert f'value="{action}"' not in listing.content.decode()
        viewer.post(f"/admin/{path}/", {"action": action, "_selected_action": [pk],
                                        "confirmed": "yes"})  # fmt: skip
    assert Scope.objects.filter(pk=scope.pk).exists()
    assert APIKey.objects.get(pk=key.pk).revoked_at is None
    assert KnowledgeBase.objects.filter(pk=kb.pk).exists()
    assert MemoryBase.objects.filter(pk=memory_base.pk).exists()
    assert not memory_base.jobs.exists()


@pytest.mark.parametrize(
    ("model", "make"),
    [
        (UsageBudget, lambda owner: UsageBudget.objects.create(owner=owner, daily_tokens=1000)),
        (EngineSettings, lambda owner: EngineSettings.objects.create(owner=owner)),
        (Flow, lambda owner: Flow.objects.create(owner=owner, name="bot")),
    ],
)
def test_an_owner_is_fixed_once_the_row_exists(admin_client, alice, bob, model, make):
    row = make(alice)
    model_admin = admin.site._registry[model]
    request = admin_client.get("/admin/").wsgi_request
    assert "owner" in model_admin.get_readonly_fields(request, row)
    assert "owner" not in model_admin.get_form(request, row).base_fields
    assert "owner" in model_admin.get_form(request, None).base_fields  # (chosen when added)


def test_django_delete_is_not_offered_where_the_service_deletes(admin_client, alice, flow):
    record(flow, "s1", "an answer worth keeping")
    key, _ = api_key_create(owner=alice, name="kept")
    kb = make_kb(alice, name="docs")
    ingest(kb, ("d1", "a document"))
    objects = [
        ("conversations/flow", flow.pk),
        ("conversations/message", Message.objects.first().pk),
        ("core/apikey", key.pk),
        ("knowledge/chunk", Chunk.objects.get(knowledge_base=kb).pk),
    ]
    for path, pk in objects:
        assert admin_client.get(f"/admin/{path}/{pk}/delete/").status_code == 403
        admin_client.post(f"/admin/{path}/", {"action": "delete_selected",
                                              "_selected_action": [pk], "post": "yes"})  # fmt: skip
    assert Flow.objects.filter(pk=flow.pk).exists() and Message.objects.exists()
    assert APIKey.objects.filter(pk=key.pk).exists()
    assert Chunk.objects.filter(knowledge_base=kb).count() == 1


def test_what_holds_those_rows_is_still_deleted_through_its_page(admin_client, alice):
    """Refusing Django's delete of chunks (or keys) must not refuse, for their sake, the
    delete of what holds them: Django's delete page checks every row it cascades to."""
    kb = make_kb(alice, name="docs")
    ingest(kb, ("d1", "a document"))
    page = admin_client.get(f"/admin/knowledge/knowledgebase/{kb.pk}/delete/")
    assert page.status_code == 200 and not page.context["perms_lacking"]
    admin_client.post(f"/admin/knowledge/knowledgebase/{kb.pk}/delete/", {"post": "yes"})
    assert not KnowledgeBase.objects.filter(pk=kb.pk).exists() and not Chunk.objects.exists()
    api_key_create(owner=alice, name="kept")
    page = admin_client.get(f"/admin/auth/user/{alice.pk}/delete/")
    assert page.status_code == 200 and "API key" not in page.context["perms_lacking"]


@pytest.mark.parametrize(
    ("app_label", "model_name"),
    [
        ("core", "apikey"),
        ("core", "usagebudget"),
        ("conversations", "flow"),
        ("memory_stores", "memorystore"),
    ],  # fmt: skip
)
def test_an_operator_who_may_add_the_rows_finds_their_owner_without_viewing_users(
    alice, app_label, model_name
):
    """Owner boxes are Django autocompletes, which asked for the permission to view
    users: an operator granted only the keys found no owner to give a new key."""
    model = next(m for m in admin.site._registry if
                 (m._meta.app_label, m._meta.model_name) == (app_label, model_name))  # fmt: skip
    operator = User.objects.create_user("keys-only", password="x", is_staff=True)
    client = Client()
    client.force_login(operator)
    ask = {"app_label": app_label, "model_name": model_name, "field_name": "owner", "term": "ali"}
    assert client.get("/admin/autocomplete/", ask).status_code == 403  # no permission yet
    operator.user_permissions.set(Permission.objects.filter(
        content_type__app_label=model._meta.app_label, codename=f"add_{model_name}"))  # fmt: skip
    found = client.get("/admin/autocomplete/", ask)
    assert found.status_code == 200
    assert found.json()["results"] == [{"id": str(alice.pk), "text": "alice"}]
    # and no more than that: the users' own pages, another field, another model
    assert client.get("/admin/auth/user/").status_code == 403
    assert client.get(f"/admin/auth/user/{alice.pk}/change/").status_code == 403
    assert client.get("/admin/autocomplete/", {**ask, "field_name": "name"}).status_code == 403
    assert client.get("/admin/autocomplete/", {**ask, "model_name": "accessevent",
                                               "app_label": "core"}).status_code == 403  # fmt: skip
    # by username only: not by a name or an address the box does not show
    alice.email, alice.first_name = "alice@corp.example", "Alicia"
    alice.save()
    for term in ("corp.example", "Alicia"):
        found = client.get("/admin/autocomplete/", {**ask, "term": term})
        assert found.status_code == 200 and found.json()["results"] == []


def test_an_owner_field_that_is_no_autocomplete_opens_no_user_list(alice):
    """The knowledge bases' admin may be changed by this operator, but offers no owner
    autocomplete: the users stay closed to them."""
    operator = User.objects.create_user("kb-only", password="x", is_staff=True)
    operator.user_permissions.set(Permission.objects.filter(
        content_type__app_label="knowledge", codename__in=["add_knowledgebase",
                                                          "change_knowledgebase"]))  # fmt: skip
    client = Client()
    client.force_login(operator)
    ask = {"app_label": "knowledge", "model_name": "knowledgebase", "field_name": "owner",
           "term": "ali"}  # fmt: skip
    assert client.get("/admin/autocomplete/", ask).status_code == 403
