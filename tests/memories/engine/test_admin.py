"""Admin: a scope's journal shown and downloaded, dream now, undo, per-owner switch."""

from __future__ import annotations

import pytest
from django.utils import timezone
from django.utils.html import escape

from ingestion.updates import updates_run
from memories.engine.models import Dream
from memories.engine.updates import update_record
from memories.facts.models import Fact
from memories.facts.services import FactIn, fact_add
from tests.memories.engine.scripted import EngineLLM, fact

pytestmark = pytest.mark.django_db
SCOPE = ("user", "alice")


def test_journal_dream_now_and_undo_from_the_admin(admin_client, alice, llm_settings, openai_server,
                                                   engine_storage):  # fmt: skip
    openai_server.chat_fn = EngineLLM(
        {"I like tea": [fact("User likes tea")]},
        dream=lambda prompt: {"facts": [], "diary": "cleared"},
    )
    llm_settings.ENGINE_DREAM_MAX_DROP = 1.0
    fact_add(owner=alice, scope=SCOPE, facts=[FactIn("User uses vim", "behavior", 0.9)])
    update = update_record(
        owner=alice, scope=SCOPE, messages=[{"role": "user", "content": "I like tea"}]
    )
    updates_run(scope_id=update.scope_id, force=True)
    scope_id = update.scope_id
    today = timezone.now().date().isoformat()

    page = admin_client.get(
        f"/admin/memory_engine/scopejournal/{scope_id}/change/"
    ).content.decode()
    assert today in page and "download" in page
    assert "- [0.90] User likes tea (id: " in page  # MEMORY.md, rendered from the facts
    day = admin_client.get(f"/admin/memory_engine/scopejournal/{scope_id}/journal/{today}/")
    assert day.status_code == 200 and "- **user**: I like tea" in day.content.decode()
    download = admin_client.get(
        f"/admin/memory_engine/scopejournal/{scope_id}/journal/{today}/?download=1"
    )
    assert download["Content-Disposition"].startswith('attachment; filename="journal-user-alice-')
    assert (
        admin_client.get(
            f"/admin/memory_engine/scopejournal/{scope_id}/journal/2001-01-01/"
        ).status_code
        == 404
    )

    dreamt = admin_client.post("/admin/memory_engine/scopejournal/",
                               {"action": "dream_now", "_selected_action": [scope_id]},
                               follow=True)  # fmt: skip
    dream = Dream.objects.get()
    # named with its owner: three owners' global scopes read alike (the admin audit)
    said = f"alice · {dream.scope}: dream {dream.pk} ({len(dream.changes)} changes)."
    # as written: Django's admin capitalised it ("Alice · ...", the admin audit)
    assert f'<li class="info">{escape(said)}</li>' in dreamt.content.decode()
    assert dream.trigger == "admin" and Fact.objects.filter(owner=alice).count() == 0
    assert "MEMORY · user/alice" in admin_client.get(
        f"/admin/memory_engine/scopejournal/{scope_id}/change/").content.decode()  # fmt: skip
    assert admin_client.get(f"/admin/memory_engine/dream/{dream.pk}/change/").status_code == 200

    chosen = {"action": "undo", "_selected_action": [dream.pk]}
    asked = admin_client.post("/admin/memory_engine/dream/", chosen)
    assert "Undo these dreams?" in asked.content.decode()
    dream.refresh_from_db()
    assert dream.status == "applied"  # only asked
    admin_client.post("/admin/memory_engine/dream/", {**chosen, "confirmed": "yes"})
    dream.refresh_from_db()
    assert dream.status == "undone"
    assert sorted(Fact.objects.filter(owner=alice).values_list("content", flat=True)) == [
        "User likes tea", "User uses vim"]  # fmt: skip
    assert admin_client.get("/admin/memory_engine/pendingupdate/").status_code == 200
    assert admin_client.get("/admin/memory_engine/enginesettings/").status_code == 200


def test_running_summaries_listed_read_and_deleted_from_the_admin(
    admin_client, alice, alice_client, llm_settings, openai_server
):
    from memories.conversations.models import ConversationSummary

    script = EngineLLM()
    openai_server.chat_fn = script
    messages = [{"id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant",
                 "content": f"turn {i} " + "word " * 25} for i in range(8)]  # fmt: skip
    payload = {"scope": ["org", "acme"], "conversation_id": "c1", "messages": messages,
               "max_tokens": 120, "max_summary_tokens": 30}  # fmt: skip
    first = alice_client.post("/api/v1/engine/summaries", payload, format="json").json()
    folded = first["folded_now"]
    assert first["llm_calls"] == 1 and folded
    summary = ConversationSummary.objects.get()

    listed = admin_client.get("/admin/conversations/conversationsummary/").content.decode()
    for shown in ("scope org/acme", "c1", "alice", folded[-1], f">{len(folded)}<"):
        assert shown in listed, shown
    page = admin_client.get(
        f"/admin/conversations/conversationsummary/{summary.pk}/change/"
    ).content.decode()
    assert first["running_summary"]["text"] in page and folded[-1] in page
    # Delete asks first, then deletes; the next call summarises again from the start.
    asked = admin_client.post(
        "/admin/conversations/conversationsummary/",
        {"action": "delete_selected", "_selected_action": [summary.pk]},
    )
    assert "Are you sure" in asked.content.decode() and ConversationSummary.objects.exists()
    admin_client.post(
        "/admin/conversations/conversationsummary/",
        {"action": "delete_selected", "_selected_action": [summary.pk], "post": "yes"},
    )
    assert not ConversationSummary.objects.exists()
    again = alice_client.post("/api/v1/engine/summaries", payload, format="json").json()
    assert again["llm_calls"] == 1 and again["folded_now"] == folded
    assert script.calls["summary"] == 2
    assert ConversationSummary.objects.get().summarized_ids == folded


def test_a_dreams_update_of_category_or_confidence_shows_what_changed():
    """The changes table showed empty "after" and "result" cells for an update that
    changed only the category or the confidence (the admin audit)."""
    from django.contrib import admin

    from memories.engine.admin import DreamAdmin

    before = {"id": "f1", "content": "User likes tea", "category": "context", "confidence": 0.6}
    dream = Dream(changes=[
        {"action": "update", "fact_id": "f1", "before": before,
         "after": {"category": "preference", "confidence": 0.6}},
        {"action": "replace", "fact_id": "f1", "before": before, "content": "User likes green tea",
         "category": "preference", "confidence": 0.9, "result": "replace"},
    ])  # fmt: skip
    html = DreamAdmin(Dream, admin.site).changes_table(dream)
    assert "<td>update</td><td>User likes tea</td><td>category: context → preference</td>" \
           "<td>update</td>" in html  # fmt: skip
    assert "<td>User likes green tea</td><td>replace</td>" in html
