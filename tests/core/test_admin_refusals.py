"""What the admin refuses is a form error or a message, never a 500, and nothing is
changed (an operator's audit found five 500s)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from core.models import APIKey
from knowledge.models import KnowledgeBase
from memories.bases.models import MemoryBase
from memories.bases.services import memory_base_create
from memories.facts.models import Fact
from memories.stores.models import MemoryStore
from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db


def _said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_a_memory_base_renamed_to_a_name_its_owner_uses_is_a_form_error(
    admin_client, alice, flow, memory_base
):
    other = memory_base_create(owner=alice, name="other-memory", flow=flow, threshold=3)
    page = admin_client.get(f"/admin/memory_bases/memorybase/{other.pk}/change/")
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if k in form.fields and v is not None}
    data.update({"name": memory_base.name, "threshold": 3, "auto_capture": "on",
                 "memorybasesession_set-TOTAL_FORMS": 0,
                 "memorybasesession_set-INITIAL_FORMS": 0})  # fmt: skip
    data = {k: v for k, v in data.items() if v is not False}
    response = admin_client.post(f"/admin/memory_bases/memorybase/{other.pk}/change/", data)
    assert response.status_code == 200
    assert "already exists" in str(response.context["adminform"].form.errors)
    assert MemoryBase.objects.get(pk=other.pk).name == "other-memory"


def test_a_knowledge_base_renamed_to_a_name_its_owner_uses_is_a_form_error(admin_client, alice):
    make_kb(alice, name="handbook")
    kb = make_kb(alice, name="notes")
    response = admin_client.post(f"/admin/knowledge/knowledgebase/{kb.pk}/change/",
                                 {"name": "handbook", "description": ""})  # fmt: skip
    assert response.status_code == 200
    assert "already exists" in str(response.context["adminform"].form.errors)
    assert KnowledgeBase.objects.get(pk=kb.pk).name == "notes"


def test_a_global_memory_over_the_fact_limit_is_a_form_error(admin_client, alice):
    response = admin_client.post("/admin/memories/globalmemory/add/",
                                 {"owner": alice.pk, "content": "x" * 2001})  # fmt: skip
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {"content": ["At most 2,000 characters."]}
    assert not Fact.objects.exists()


def test_deleting_a_file_stores_knowledge_base_is_a_message(admin_client, alice):
    kb = make_kb(alice, name="memory-store:files")
    MemoryStore.objects.create(owner=alice, name="files", type="file", config={},
                               knowledge_base=kb)  # fmt: skip
    response = admin_client.post("/admin/knowledge/knowledgebase/",
                                 {"action": "delete_with_chunks", "_selected_action": [kb.pk],
                                  "confirmed": "yes"}, follow=True)  # fmt: skip
    assert response.status_code == 200
    assert any("belongs to memory store files" in said for said in _said(response))
    assert KnowledgeBase.objects.filter(pk=kb.pk).exists()


def test_a_store_config_nested_past_the_parsers_depth_is_a_form_error(admin_client, alice):
    deep = "a: " + "[" * 2000 + "]" * 2000
    response = admin_client.post("/admin/memory_stores/memorystore/add/",
                                 {"owner": alice.pk, "name": "deep", "type": "simple",
                                  "config": deep})  # fmt: skip
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["config"] == ["body: JSON may be nested at most 64 levels deep."]
    assert not MemoryStore.objects.exists()


def test_revoking_keys_counts_only_what_it_revoked(admin_client, alice):
    from core.models import AccessEvent, APIKey
    from core.services import api_key_create, api_key_revoke

    live, _ = api_key_create(owner=alice, name="live")
    gone, _ = api_key_create(owner=alice, name="gone")
    api_key_revoke(api_key=gone)
    events = AccessEvent.objects.count()
    response = admin_client.post("/admin/core/apikey/", {"action": "revoke_keys",
                                 "_selected_action": [live.pk, gone.pk], "confirmed": "yes"},
                                 follow=True)  # fmt: skip
    assert _said(response) == ["Revoked 1 key(s). 1 already revoked, unchanged."]
    assert APIKey.objects.get(pk=live.pk).revoked_at is not None
    assert AccessEvent.objects.count() == events + 1


def test_a_global_memory_already_held_is_not_said_to_be_added(admin_client, alice):
    text = {"owner": alice.pk, "content": "The office closes at six"}
    first = admin_client.post("/admin/memories/globalmemory/add/", text, follow=True)
    assert any("was added successfully" in said for said in _said(first))
    again = admin_client.post("/admin/memories/globalmemory/add/", text, follow=True)
    assert _said(again) == ["Not added (duplicate): the global memories already hold it."]
    assert Fact.objects.count() == 1


def test_a_pending_update_page_offers_no_save(admin_client, alice, llm_settings):
    from memories.engine.facade import MemoryEngine
    from memories.engine.models import PendingUpdate

    engine = MemoryEngine(owner=alice.pk, values={})
    engine.flush(["user", "u1"], [{"role": "user", "content": "I moved to Porto"}])
    update = PendingUpdate.objects.get()
    html = admin_client.get(f"/admin/memory_engine/pendingupdate/{update.pk}/change/")
    assert html.status_code == 200 and 'name="_save"' not in html.content.decode()


def test_loading_a_store_that_loads_nothing_says_so(admin_client, alice):
    store = MemoryStore.objects.create(owner=alice, name="notes", type="simple", config={})
    response = admin_client.post("/admin/memory_stores/memorystore/",
                                 {"action": "load_stores", "_selected_action": [store.pk]},
                                 follow=True)  # fmt: skip
    assert _said(response) == ["Nothing to load for notes: only a file store loads files."]


def _mb_form_data(admin_client, mb, **changes) -> dict:
    page = admin_client.get(f"/admin/memory_bases/memorybase/{mb.pk}/change/")
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if k in form.fields and v not in (None, False)}
    data.update({"memorybasesession_set-TOTAL_FORMS": 0,
                 "memorybasesession_set-INITIAL_FORMS": 0, **changes})  # fmt: skip
    return data


@pytest.mark.parametrize(
    ("changes", "errors"),
    [
        ({"threshold": 2147483647},
         {"threshold": ["Ensure this value is less than or equal to 100000."]}),
        ({"threshold": 0}, {"threshold": ["Ensure this value is greater than or equal to 1."]}),
        ({"preprocess_instructions": "x" * 10001},
         {"preprocess_instructions": ["Ensure this field has no more than 10000 characters."]}),
    ],
)  # fmt: skip
def test_the_admin_refuses_what_the_api_refuses(admin_client, memory_base, changes, errors):
    """The admin saved a threshold the API refuses, so the unchanged GET body then
    failed its PATCH; a threshold of 0 showed a raw constraint name."""
    data = _mb_form_data(admin_client, memory_base, **changes)
    response = admin_client.post(f"/admin/memory_bases/memorybase/{memory_base.pk}/change/",
                                 data)  # fmt: skip
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == errors
    memory_base.refresh_from_db()
    assert memory_base.threshold == 3 and memory_base.preprocess_instructions == ""


def test_a_budget_over_the_apis_limit_is_a_form_error(admin_client, alice):
    response = admin_client.post("/admin/core/usagebudget/add/",
                                 {"owner": alice.pk, "daily_tokens": 10**15 + 1})  # fmt: skip
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {
        "daily_tokens": ["From 0 to 1,000,000,000,000,000, or empty."]
    }


def test_a_key_forms_other_error_brings_no_constraint_error(admin_client, alice):
    """Any error of the add form also showed "Constraint apikey_scope_1_to_8_segments is
    violated" though the scope was left empty."""
    response = admin_client.post("/admin/core/apikey/add/", {"owner": alice.pk, "name": "k",
                                 "tools": "no_such_tool"})  # fmt: skip
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["tools"]
    assert not APIKey.objects.filter(name="k").exists()


def test_a_store_config_past_the_apis_depth_or_with_nan_is_a_form_error(admin_client, alice):
    """The admin checked only Python's recursion limit: 65 to ~900 levels were saved,
    and a YAML .nan too, where the API refuses both."""
    for config, said in (("a: " + "[" * 100 + "]" * 100, "nested at most 64 levels deep"),
                         ("a: .nan", "Numbers must be finite (NaN is no number).")):  # fmt: skip
        response = admin_client.post("/admin/memory_stores/memorystore/add/",
                                     {"owner": alice.pk, "name": "deep", "type": "simple",
                                      "config": config})  # fmt: skip
        assert response.status_code == 200
        assert said in response.context["adminform"].form.errors["config"][0]
    assert not MemoryStore.objects.exists()
