"""The memory base admin as an operator uses it: buttons and counters on the change page,
owners by name, one message per outcome, a confirmation before anything destructive."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from core.models import APIKey
from knowledge.models import Chunk, KnowledgeBase
from memories.bases import services
from memories.bases.models import MemoryBase, MemoryBaseJob
from memories.facts.models import Scope
from tests.conftest import record
from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db(transaction=True)
LIST = "/admin/memory_bases/memorybase/"


def _change(mb) -> str:
    return f"{LIST}{mb.pk}/change/"


def _messages(response) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in get_messages(response.wsgi_request)]


def test_change_page_has_buttons_counters_sessions_and_owner_by_name(
    admin_client, flow, memory_base
):
    record(flow, "s1", "a", "b", "c")  # threshold 3: ingested
    record(flow, "s2", "d")
    html = admin_client.get(_change(memory_base)).content.decode()
    assert f'action="{LIST}{memory_base.pk}/sync/"' in html and ">Sync now</button>" in html
    assert f'href="{LIST}{memory_base.pk}/regenerate/"' in html and ">Regenerate…</a>" in html
    counters = {
        label: html.split(f'id="counter-{label}">', 1)[1].split("<", 1)[0]
        for label in ("sessions", "pending", "processed", "chunks", "status")
    }
    assert counters == {
        "sessions": "2",
        "pending": "1",
        "processed": "3",
        "chunks": "3",
        "status": "ok",
    }
    assert "s1" in html and "s2" in html and "synced" in html and "pending" in html
    # The owner is a name, not an id in a box to type into.
    assert ">alice</a>" in html
    assert 'name="owner"' not in html and 'name="flow"' not in html


def test_sync_now_button_reports_one_message_per_outcome(admin_client, flow, memory_base):
    record(flow, "s1", "a")
    response = admin_client.post(f"{LIST}{memory_base.pk}/sync/")
    assert response.status_code == 302 and response["Location"] == _change(memory_base)
    assert _messages(response) == [
        ("success", "support-memory: sync started, 1 ingestion job queued.")
    ]
    admin_client.get(response["Location"])  # the page shows (and so consumes) the message
    again = admin_client.post(f"{LIST}{memory_base.pk}/sync/")
    assert _messages(again) == [
        ("info", "support-memory: nothing to sync, no session has pending messages.")
    ]
    assert admin_client.get(f"{LIST}{memory_base.pk}/sync/").status_code == 405


def test_a_refusal_is_one_red_message_and_nothing_else(
    admin_client, flow, memory_base, monkeypatch
):
    monkeypatch.setattr(services, "_dispatch", lambda job: None)
    record(flow, "s1", "a")
    services.memory_base_flush(memory_base=memory_base)  # a queued job nobody runs
    job = MemoryBaseJob.objects.get()
    response = admin_client.post(
        LIST, {"action": "regenerate", "_selected_action": [memory_base.pk], "confirmed": "yes"}
    )
    assert _messages(response) == [
        (
            "error",
            f"support-memory: not started, session 's1' already has an active ingestion job "
            f"{job.pk} (queued).",
        )
    ]
    assert MemoryBaseJob.objects.get() == job


def test_regenerate_asks_first_on_the_page_and_in_the_list(admin_client, flow, memory_base):
    record(flow, "s1", "a", "b", "c")
    before = sorted(Chunk.objects.values_list("source_key", flat=True))
    page = admin_client.get(f"{LIST}{memory_base.pk}/regenerate/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Regenerate this memory base?" in html and "Yes, regenerate" in html
    assert "delete all chunks of the memory base&#x27;s knowledge base" in html
    listed = admin_client.post(LIST, {"action": "regenerate", "_selected_action": [memory_base.pk]})
    assert listed.status_code == 200 and "Regenerate these memory bases?" in listed.content.decode()
    assert MemoryBaseJob.objects.count() == 1  # the capture's own job; nothing new yet
    done = admin_client.post(f"{LIST}{memory_base.pk}/regenerate/", {"confirmed": "yes"})
    assert done.status_code == 302
    assert _messages(done) == [("success", "support-memory: regenerating, 1 job queued.")]
    assert sorted(Chunk.objects.values_list("source_key", flat=True)) == before


@pytest.mark.parametrize(
    "url, action, make, title",
    [
        (LIST, "delete_with_knowledge_base", "memory_base", "Delete these memory bases?"),
        (
            "/admin/knowledge/knowledgebase/",
            "delete_with_chunks",
            "kb",
            "Delete these knowledge bases?",
        ),
        ("/admin/core/apikey/", "revoke_keys", "key", "Revoke these API keys?"),
        ("/admin/memories/scope/", "erase", "end_user", "Erase these scopes?"),
    ],
)
def test_every_destructive_action_asks_first(
    admin_client, alice, flow, memory_base, url, action, make, title
):
    objects = {
        "memory_base": lambda: memory_base,
        "kb": lambda: make_kb(alice, name="notes"),
        "key": lambda: APIKey.objects.create(owner=alice, name="k", prefix="p", digest="d"),
        "end_user": lambda: Scope.objects.create(
            owner=alice, external_id="u1", path=["user", "u1"]
        ),
    }
    obj = objects[make]()
    model = type(obj)
    before = list(model.objects.values_list("pk", flat=True))
    asked = admin_client.post(url, {"action": action, "_selected_action": [obj.pk]})
    assert asked.status_code == 200
    html = asked.content.decode()
    assert title in html and 'name="confirmed" value="yes"' in html and str(obj) in html
    assert list(model.objects.values_list("pk", flat=True)) == before  # nothing happened yet
    if make == "key":
        assert APIKey.objects.get(pk=obj.pk).revoked_at is None
    done = admin_client.post(
        url, {"action": action, "_selected_action": [obj.pk], "confirmed": "yes"}
    )
    assert done.status_code == 302
    if make == "key":
        assert APIKey.objects.get(pk=obj.pk).revoked_at is not None
    else:
        assert not model.objects.filter(pk=obj.pk).exists()


def test_a_memory_bases_knowledge_base_is_not_deleted_from_the_knowledge_admin(
    admin_client, flow, memory_base
):
    kb = memory_base.knowledge_base
    url = "/admin/knowledge/knowledgebase/"
    done = admin_client.post(
        url, {"action": "delete_with_chunks", "_selected_action": [kb.pk], "confirmed": "yes"}
    )
    assert _messages(done) == [
        (
            "error",
            "Memory: support-memory is a memory base's own knowledge base and is not deleted "
            "here: delete the memory base instead (Memory bases), which deletes its knowledge "
            "base with it.",
        )
    ]
    page = admin_client.get(f"{url}{kb.pk}/change/").content.decode()
    assert "delete the memory base instead" in page
    assert f"{url}{kb.pk}/delete/" not in page  # no Delete link
    assert admin_client.post(f"{url}{kb.pk}/delete/", {"post": "yes"}).status_code == 403
    assert KnowledgeBase.objects.filter(pk=kb.pk).exists()
    assert MemoryBase.objects.filter(pk=memory_base.pk).exists()


def test_owners_are_usernames_on_every_admin_page(admin_client, alice, flow, memory_base):
    record(flow, "s1", "a")
    kb = make_kb(alice, name="notes")
    pages = [
        LIST,
        _change(memory_base),
        "/admin/knowledge/knowledgebase/",
        f"/admin/knowledge/knowledgebase/{kb.pk}/change/",
        "/admin/conversations/flow/",
        f"/admin/conversations/flow/{flow.pk}/change/",
        "/admin/conversations/message/",
        "/admin/core/apikey/add/",
    ]
    for page in pages:
        html = admin_client.get(page).content.decode()
        assert 'class="vForeignKeyRawIdAdminField"' not in html, page
    assert (
        "alice"
        in admin_client.get(f"/admin/knowledge/knowledgebase/{kb.pk}/change/").content.decode()
    )


def test_a_mismatch_says_what_the_counters_show(admin_client, flow, memory_base):
    """One session's chunks deleted behind the base's back, another's kept: the warning
    said the knowledge base "holds no chunks" beside a count of 3 (an operator's audit)."""
    record(flow, "s1", "a", "b", "c")
    record(flow, "s2", "d", "e", "f")
    Chunk.objects.filter(session_id="s1").delete()
    response = admin_client.get(_change(memory_base))
    assert _messages(response) == [(
        "warning",
        "Mismatch detected: the chunks of 1 processed session(s) are gone from the knowledge "
        "base. Press Regenerate… above to rebuild it.",
    )]  # fmt: skip
    listing = admin_client.get(LIST)
    assert [text for _, text in _messages(listing)] == [
        "Mismatch detected in support-memory: chunks of processed messages are missing. Open "
        "it and press Regenerate (or select it and run “Regenerate”)."
    ]


def test_the_delete_page_names_the_knowledge_base_that_goes_too(admin_client, memory_base):
    html = admin_client.get(f"{LIST}{memory_base.pk}/delete/").content.decode()
    assert f"Knowledge base: {memory_base.knowledge_base.name} (and its 0 chunks)" in html


def test_a_view_only_account_sees_no_buttons(client, flow, memory_base):
    from django.contrib.auth.models import Permission, User

    viewer = User.objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    client.force_login(viewer)
    html = client.get(_change(memory_base)).content.decode()
    assert "support-memory" in html
    assert "Sync now" not in html and "Regenerate…" not in html


def test_a_memory_base_with_many_sessions_lists_those_synced_last(
    admin_client, alice, flow, memory_base, monkeypatch
):
    """Every session was rendered inline: 2,000 sessions made a 3 MB page of 2.6 s (the
    admin audit). The page lists the INLINE_SESSIONS synced last and says how many there
    are; the counters and the list's pending column are summed by the database and
    still count every session."""
    from memories.bases import admin as bases_admin
    from memories.bases.models import MemoryBaseSession
    from memories.bases.services import memory_base_create
    from memories.conversations.services import flow_create

    monkeypatch.setattr(bases_admin, "INLINE_SESSIONS", 2)
    record(flow, "s1", "a", "b", "c")  # threshold 3: ingested (synced)
    record(flow, "s2", "d")
    record(flow, "s3", "e", "f")
    record(flow, "s4", "g")
    other = memory_base_create(owner=alice, name="other", flow=flow_create(owner=alice, name="f2"))
    record(other.flow, "t1", "x")
    sessions = {s.session_id: s for s in MemoryBaseSession.objects.filter(memory_base=memory_base)}
    assert set(sessions) == {"s1", "s2", "s3", "s4"}
    html = admin_client.get(_change(memory_base)).content.decode()
    listed = [s for s in sessions if f">{s}</td>" in html or f"<p>{s}</p>" in html]
    assert len(listed) == 2 and "s1" in listed  # s1 synced; then the newest (s4)
    assert "s4" in listed
    assert ('id="sessions-note">The sessions below are the 2 synced last of 4: '
            f"GET /api/v1/memory-bases/{memory_base.pk}/sessions lists all.</p>") in html  # fmt: skip
    assert 'id="counter-sessions">4<' in html and 'id="counter-pending">4<' in html
    page = admin_client.get(LIST)
    pending = {mb.name: mb.pending_total for mb in page.context["cl"].result_list}
    assert pending == {memory_base.name: 4, "other": 1}


def test_the_page_saves_when_the_sessions_listed_moved_since_it_was_read(
    admin_client, flow, memory_base, monkeypatch
):
    """The sessions listed are those synced last, so one synced between the page's GET
    and its POST changes the list. A review feared the save would then fail on a hidden
    field ("Select a valid choice"); it does not (checked before and after making the
    inline read-only for Django too)."""
    from django.utils import timezone

    from memories.bases import admin as bases_admin
    from memories.bases.models import MemoryBaseSession

    monkeypatch.setattr(bases_admin, "INLINE_SESSIONS", 2)
    for session in ("s1", "s2", "s3"):
        record(flow, session, "x")
    page = admin_client.get(_change(memory_base))
    form = page.context["adminform"].form
    data = {
        name: form.initial.get(name) for name in form.fields if form.initial.get(name) is not None
    }
    data.update({"name": "renamed", "auto_capture": "on" if memory_base.auto_capture else ""})
    for inline in page.context["inline_admin_formsets"]:
        formset = inline.formset
        data.update(formset.management_form.initial | {
            f"{formset.prefix}-{k}": v for k, v in formset.management_form.initial.items()
        })  # fmt: skip
        for n, inline_form in enumerate(formset.forms):
            data[f"{formset.prefix}-{n}-id"] = inline_form.instance.pk
            data[f"{formset.prefix}-{n}-memory_base"] = memory_base.pk
    shown = {f.instance.session_id for i in page.context["inline_admin_formsets"]
             for f in i.formset.forms}  # fmt: skip
    hidden = ({"s1", "s2", "s3"} - shown).pop()
    MemoryBaseSession.objects.filter(memory_base=memory_base, session_id=hidden).update(
        last_sync_at=timezone.now()
    )  # now one of those listed
    saved = admin_client.post(_change(memory_base), {k: v for k, v in data.items() if v != ""})
    assert saved.status_code == 302, saved.context["adminform"].form.errors if saved.context else ""
    memory_base.refresh_from_db()
    assert memory_base.name == "renamed"
