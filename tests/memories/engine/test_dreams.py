"""Deep Dream: consolidation applied through the core-fact services, audited, written to
MEMORY.md and the diary, skipped when nothing changed, refused when too lossy, undone."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from core.errors import ServiceError
from core.models import UsageDay
from core.providers.embeddings import get_embedder
from ingestion.updates import updates_run
from memories.engine import files
from memories.engine.dreams import (
    DreamTooLossy,
    dream_run,
    dream_undo,
    dreams_daily,
    memory_md_read,
    render_memory_md,
)
from memories.engine.models import Dream
from memories.engine.owner_settings import engine_settings_update
from memories.engine.updates import update_record
from memories.facts.models import Fact, FactChange, FactVersion
from memories.facts.scopes import global_scope_ensure, scope_find
from memories.facts.selectors import facts_snapshot
from memories.facts.services import FactIn, fact_add
from tests.memories.engine.scripted import EngineLLM
from tests.memories.facts.seed import seed

pytestmark = pytest.mark.django_db
SCOPE = ("user", "alice")
KEYS = ("id", "content", "category", "confidence", "source_kind", "source_ref", "observed_at")


class _Counting:
    def __init__(self, inner):
        self.inner, self.model, self.texts = inner, inner.model, []

    def embed(self, texts):
        self.texts += list(texts)
        return self.inner.embed(texts)


def _state(owner):
    row = scope_find(owner=owner, scope=SCOPE)
    return sorted(tuple(f[k] for k in KEYS) for f in facts_snapshot(scope=row))


def _ids(prompt: str) -> dict[str, str]:
    """content -> id, from the MEMORY.md lines of a dream prompt."""
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^- \[[0-9.]+\] (.*) \(id: ([0-9a-f-]+)\)$", prompt, re.M)
    }


def consolidate(prompt: str) -> dict:
    ids = _ids(prompt)
    return {
        "facts": [
            {"id": ids["User likes green tea"], "content": "User drinks green tea every morning",
             "category": "behavior", "confidence": 0.95},  # refined, merged with "likes tea"
            {"id": ids["User lives in Paris"], "content": "User lives in Berlin",
             "category": "context", "confidence": 0.9},  # the journal is newer: it wins
            {"id": ids["User uses vim"], "content": "User uses vim", "category": "behavior",
             "confidence": 0.95},  # more confident
            {"id": None, "content": "User works remotely", "category": "context",
             "confidence": 0.8},  # learned from the journal
        ],
        "diary": "Merged the two tea facts; Alice moved to Berlin.",
    }  # fmt: skip


def keep_all(prompt: str) -> dict:
    return {"facts": [{"id": i, "content": c} for c, i in _ids(prompt).items()]}


@pytest.fixture
def dreaming(alice, llm_settings, openai_server, engine_storage):
    script = EngineLLM({"I moved to Berlin and I work remotely now": []}, dream=consolidate)
    openai_server.chat_fn = script
    fact_add(owner=alice, scope=SCOPE, reason="seed", facts=[
        FactIn("User likes tea", "preference", 0.8), FactIn("User likes green tea", "preference", 0.9),
        FactIn("User lives in Paris", "context", 0.9), FactIn("User uses vim", "behavior", 0.8),
    ])  # fmt: skip
    update = update_record(owner=alice, scope=SCOPE, messages=[
        {"role": "user", "content": "I moved to Berlin and I work remotely now"}])  # fmt: skip
    updates_run(scope_id=update.scope_id, force=True)  # the journal entry
    return script


def test_a_dream_consolidates_audits_and_writes_memory_md_and_diary(alice, dreaming):
    before = _state(alice)
    outcome = dream_run(owner=alice, scope=SCOPE, lookback_days=2)
    dream = outcome.dream
    assert not outcome.skipped and dreaming.calls["dream"] == 1
    # Counted for the owner and scope (issue 29): the fixture's extraction, then the dream.
    counted = UsageDay.objects.filter(owner=alice).values_list("kind", "subject", "calls")
    assert sorted(counted) == [("dream", "user/alice", 1), ("extraction", "user/alice", 1)]
    prompt = dreaming.prompts["dream"][0]
    assert "- [0.90] User lives in Paris (id: " in prompt
    assert "- **user**: I moved to Berlin and I work remotely now" in prompt  # the journal
    after = sorted((f["content"], f["category"], f["confidence"], f["source_kind"])
                   for f in facts_snapshot(scope=dream.scope))  # fmt: skip
    assert after == [
        ("User drinks green tea every morning", "behavior", 0.95, "dream"),
        ("User lives in Berlin", "context", 0.9, "dream"),
        ("User uses vim", "behavior", 0.95, "api"),
        ("User works remotely", "context", 0.8, "journal"),  # learned from the journal
    ]
    remote = next(f for f in facts_snapshot(scope=dream.scope) if "remotely" in f["content"])
    assert remote["source_ref"] == timezone.now().date().isoformat()  # the day it read
    assert sorted(c["action"] for c in dream.changes) == [
        "add",
        "delete",
        "replace",
        "replace",
        "update",
    ]
    audit = FactChange.objects.filter(reason=f"dream {dream.pk}")
    assert sorted(audit.values_list("action", flat=True)) == [
        "add",
        "delete",
        "replace",
        "replace",
        "update",
    ]
    assert dream.facts_before == [f for f in dream.facts_before] and len(dream.facts_before) == 4
    assert sorted(tuple(f[k] for k in KEYS) for f in dream.facts_before) == before

    md = files.read_text(files.memory_md_path(alice.pk, list(SCOPE)))
    assert md == dream.memory_md_after
    assert md.startswith("# MEMORY · user/alice\n\n4 facts.\n\n## context\n\n")
    assert "- [0.90] User lives in Berlin (id: " in md and "Paris" not in md
    diary = files.read_text(files.diary_path(alice.pk, list(SCOPE), timezone.now().date()))
    assert f"## Dream {dream.pk}" in diary
    assert "Read 4 facts and 1 journal day; 1 add, 1 delete, 2 replace, 1 update." in diary
    assert "Merged the two tea facts; Alice moved to Berlin." in diary


def test_dream_additions_honour_the_threshold_and_name_their_journal_day(alice, dreaming):
    today = timezone.now().date()
    yesterday = today - timedelta(days=1)
    files.journal_append(owner_id=alice.pk, scope=list(SCOPE), source="api",
                         messages=[{"role": "user", "content": "I got a cat"}],
                         at=timezone.now() - timedelta(days=1))  # fmt: skip

    def answer(prompt):
        return {"facts": [*keep_all(prompt)["facts"],
            {"id": None, "content": "User has a cat", "category": "context", "confidence": 0.9,
             "day": yesterday.isoformat()},  # names the day it read it on
            {"id": None, "content": "User works remotely", "category": "context"},  # no confidence
            {"id": None, "content": "User may own a boat", "confidence": 0.3},  # a guess
        ]}  # fmt: skip

    dreaming.dream = answer
    dream = dream_run(owner=alice, scope=SCOPE, lookback_days=2).dream
    assert dream.journal_days == [yesterday.isoformat(), today.isoformat()]
    new = {f["content"]: (f["confidence"], f["source_kind"], f["source_ref"])
           for f in facts_snapshot(scope=dream.scope) if f["source_kind"] != "api"}  # fmt: skip
    assert new == {
        "User has a cat": (0.9, "journal", yesterday.isoformat()),
        # no confidence given: the threshold (ENGINE_MIN_CONFIDENCE), not 1.0; no day
        # named: the newest day the dream read
        "User works remotely": (0.7, "journal", today.isoformat()),
    }
    assert [(c["content"], c["result"]) for c in dream.changes if c["action"] == "add"] == [
        ("User has a cat", "add"), ("User works remotely", "add"),
        ("User may own a boat", "below_threshold"),  # thresholded like any new fact
    ]  # fmt: skip
    undone = dream_undo(owner=alice, dream_id=dream.pk)
    assert undone.status == "undone"
    assert not [f for f in facts_snapshot(scope=dream.scope) if f["source_kind"] != "api"]


def test_unchanged_inputs_skip_the_llm(alice, dreaming):
    first = dream_run(owner=alice, scope=SCOPE).dream
    again = dream_run(owner=alice, scope=SCOPE)  # its own result, same journal
    assert again.skipped and again.dream.pk == first.pk and dreaming.calls["dream"] == 1
    assert Dream.objects.count() == 1


def test_undo_restores_the_facts_and_memory_md(alice, dreaming):
    before = _state(alice)
    dream = dream_run(owner=alice, scope=SCOPE).dream
    assert _state(alice) != before
    closed = FactVersion.objects.filter(source={"kind": "dream", "ref": str(dream.pk)})
    assert closed.exists()  # what the dream dropped or rewrote was kept as versions
    embedder = _Counting(get_embedder())
    undone = dream_undo(owner=alice, dream_id=dream.pk, embedder=embedder)
    assert undone.status == "undone" and undone.undone_at is not None
    assert _state(alice) == before  # same ids, texts, categories, confidences, sources, times
    assert embedder.texts == []  # restored through their versions: nothing embedded again
    md = files.read_text(files.memory_md_path(alice.pk, list(SCOPE)))
    assert md == dream.memory_md_before
    assert set(FactChange.objects.filter(reason=f"undo of dream {dream.pk}").values_list(
        "action", flat=True)) <= {"add", "delete", "update"}  # fmt: skip
    with pytest.raises(ServiceError) as twice:
        dream_undo(owner=alice, dream_id=dream.pk)
    assert (twice.value.status_code, twice.value.code) == (409, "dream_not_undoable")
    assert _state(alice) == before


def test_undo_keeps_what_was_learned_after_the_dream(alice, dreaming):
    before = _state(alice)
    dream = dream_run(owner=alice, scope=SCOPE).dream
    fact_add(owner=alice, scope=SCOPE, facts=[FactIn("User has a cat", "context", 0.9)])
    dream_undo(owner=alice, dream_id=dream.pk)
    now = _state(alice)
    assert [f for f in now if f[1] != "User has a cat"] == before
    assert any(f[1] == "User has a cat" for f in now)


def test_only_the_latest_dream_can_be_undone_and_not_by_another_owner(alice, bob, dreaming):
    first = dream_run(owner=alice, scope=SCOPE).dream
    fact_add(owner=alice, scope=SCOPE, facts=[FactIn("User has a cat", "context", 0.9)])
    dreaming.dream = keep_all
    second = dream_run(owner=alice, scope=SCOPE).dream
    with pytest.raises(ServiceError) as older:
        dream_undo(owner=alice, dream_id=first.pk)
    assert older.value.code == "dream_not_undoable"
    assert older.value.details["latest_dream"] == str(second.pk)
    state = _state(alice)
    for bad in (bob,):
        with pytest.raises(ServiceError) as other:
            dream_undo(owner=bad, dream_id=second.pk)
        assert other.value.status_code == 404
    with pytest.raises(ServiceError) as malformed:
        dream_undo(owner=alice, dream_id="not-a-uuid")
    assert malformed.value.status_code == 404
    assert _state(alice) == state
    dream_undo(owner=alice, dream_id=second.pk)
    dream_undo(owner=alice, dream_id=first.pk)  # now the latest applied one


def test_a_dream_dropping_too_much_is_refused_and_changes_nothing(alice, dreaming):
    dreaming.dream = lambda prompt: {"facts": [], "diary": "Forgot everything."}
    before, md = _state(alice), _memory_md(alice)
    with pytest.raises(DreamTooLossy) as refused:
        dream_run(owner=alice, scope=SCOPE)
    assert refused.value.status_code == 422
    assert refused.value.details == {"dropped": 4, "facts": 4, "max_drop": 0.5}
    assert _state(alice) == before and Dream.objects.count() == 0
    assert _memory_md(alice) == md  # as the update run left it


def test_malformed_dream_answers_change_nothing(alice, dreaming):
    dreaming.dream = lambda prompt: "I cannot do that"
    before = _state(alice)
    with pytest.raises(ServiceError) as bad:
        dream_run(owner=alice, scope=SCOPE)
    assert bad.value.status_code == 502 and dreaming.calls["dream"] == 2  # asked again once
    assert _state(alice) == before and Dream.objects.count() == 0


def test_daily_schedule_dreams_changed_scopes_unless_the_owner_turned_it_off(alice, bob, dreaming,
                                                                            settings):  # fmt: skip
    settings.ENGINE_DREAM_MIN_CHANGES = 1  # (any change: the idle gate has its own test)
    # (an owner's global memories changed too: they are not consolidated)
    seed(global_scope_ensure(owner=alice), "The support team is available on weekdays from 9 to 5")
    assert dreams_daily() == 1  # one task queued (run at once in tests)
    assert Dream.objects.get().trigger == "schedule"
    assert dreams_daily() == 0  # nothing changed since (the dream's own changes do not count)
    dreaming.dream = keep_all
    engine_settings_update(owner=alice, dream_schedule=False)
    update = update_record(
        owner=alice, scope=SCOPE, messages=[{"role": "user", "content": "hi again"}]
    )
    updates_run(scope_id=update.scope_id, force=True)
    assert dreams_daily() == 0 and Dream.objects.count() == 1 and dreaming.calls["dream"] == 1
    engine_settings_update(owner=alice, dream_schedule=True)
    assert dreams_daily() == 1 and Dream.objects.count() == 2  # the journal changed
    assert dreams_daily(now=timezone.now() + timedelta(days=2)) == 0  # nothing new since


def test_daily_schedule_fans_out_one_task_per_changed_scope(alice, bob, dreaming, monkeypatch):
    """Every scope whose facts or journal changed since its last dream gets its own task
    (a slow or failing scope holds up no other); facts written through the REST API
    count, not only processed flushes."""
    from memories.engine import dreams

    monkeypatch.setattr(dreams.settings, "ENGINE_DREAM_MIN_CHANGES", 1)
    queued = []
    real = dreams.enqueue
    monkeypatch.setattr(dreams, "enqueue", lambda *a, **k: (queued.append((a, k)), real(*a, **k)))
    dreaming.dream = keep_all
    engine = ("org", "acme")
    fact_add(owner=alice, scope=engine, facts=[FactIn("Acme ships on Fridays", "context", 0.9)])
    fact_add(owner=bob, scope=SCOPE, facts=[FactIn("Bob's alice likes tea", "context", 0.9)])
    engine_settings_update(owner=bob, dream_schedule=False)
    acme = scope_find(owner=alice, scope=engine)
    alices = scope_find(owner=alice, scope=SCOPE)

    assert dreams_daily() == 2
    assert sorted(a[1] for a, _ in queued) == sorted([acme.pk, alices.pk])
    assert {(a[0], k["task_name"]) for a, k in queued} == {
        ("ingestion.tasks.engine_dream_scope", f"engine-dream-{acme.pk}"),
        ("ingestion.tasks.engine_dream_scope", f"engine-dream-{alices.pk}"),
    }
    assert sorted(Dream.objects.values_list("scope_id", "trigger")) == sorted(
        [(acme.pk, "schedule"), (alices.pk, "schedule")]
    )
    # a fact added through the API since: that scope only
    fact_add(owner=alice, scope=engine, facts=[FactIn("Acme has 40 staff", "context", 0.9)])
    queued.clear()
    assert dreams_daily() == 1 and [a[1] for a, _ in queued] == [acme.pk]
    # only a dream's own audit reason ("dream <id>") is left out, not any text like it
    fact_add(owner=alice, scope=SCOPE, reason="dream job, said in passing",
                  facts=[FactIn("User wants to be a pilot", "goal", 0.9)])  # fmt: skip
    queued.clear()
    assert dreams_daily() == 1 and [a[1] for a, _ in queued] == [alices.pk]


def test_a_scheduled_dream_is_safe_to_run_twice_and_never_beside_another(
    alice, dreaming, monkeypatch
):
    from ingestion.tasks import engine_dream_scope
    from memories.engine import dreams
    from tests.memories.engine.scripted import scope_held

    row = scope_find(owner=alice, scope=SCOPE)
    day = timezone.now().date().isoformat()
    monkeypatch.setattr(dreams, "SCHEDULED_WAIT_SECONDS", 0.5)
    with scope_held(row.pk):  # a run (an update, another dream) of the scope under way
        assert engine_dream_scope(row.pk, day) == "busy"
    assert Dream.objects.count() == 0 and dreaming.calls["dream"] == 0
    assert engine_dream_scope(row.pk, day) == "dreamed"
    assert engine_dream_scope(row.pk, day) == "skipped"  # a second delivery: same inputs
    assert Dream.objects.count() == 1 and dreaming.calls["dream"] == 1
    dreaming.dream = lambda prompt: {"facts": [], "diary": "Forgot everything."}
    fact_add(owner=alice, scope=SCOPE, facts=[FactIn("User has a cat", "context", 0.9)])
    assert engine_dream_scope(row.pk, day) == "failed"  # refused (too lossy), logged
    assert Dream.objects.count() == 1
    assert engine_dream_scope(999_999, day) == "gone"


def test_dream_command_dry_run_then_dream_then_undo(alice, dreaming, capsys):
    before = _state(alice)
    call_command("dream", "alice", "user", "alice", "--dry-run")
    out = capsys.readouterr().out
    assert "4 facts, journal days: " in out and "would call the LLM once" in out
    assert dreaming.calls["dream"] == 0 and Dream.objects.count() == 0
    call_command("dream", "alice", "user", "alice")
    dream = Dream.objects.get()
    assert dream.trigger == "command"
    assert f"Undo: manage.py dream alice --undo {dream.pk}" in capsys.readouterr().out
    call_command("dream", "alice", "--undo", str(dream.pk))
    assert _state(alice) == before


# --- MEMORY.md between dreams, and files a crash left unwritten ----------------------
def _memory_md(owner) -> str | None:
    return files.read_text(files.memory_md_path(owner.pk, list(SCOPE)))


def test_memory_md_is_rendered_on_read_and_rewritten_by_update_runs(alice, dreaming):
    dream = dream_run(owner=alice, scope=SCOPE).dream
    assert _memory_md(alice) == dream.memory_md_after
    row = dream.scope
    fact_add(owner=alice, scope=SCOPE, facts=[FactIn("User has a cat", "context", 0.9)])
    assert "User has a cat" not in _memory_md(alice)  # an API write leaves the file behind
    text = memory_md_read(row)  # a read renders it from the database, and stores it
    assert "- [0.90] User has a cat (id: " in text and _memory_md(alice) == text
    assert text == render_memory_md(row, facts_snapshot(scope=row))

    fact_add(owner=alice, scope=SCOPE, facts=[FactIn("User has a dog", "context", 0.9)])
    dreaming.extractions["I got a parrot"] = [
        {"content": "User has a parrot", "category": "context", "confidence": 0.9}
    ]
    update = update_record(owner=alice, scope=SCOPE,
                           messages=[{"role": "user", "content": "I got a parrot"}])  # fmt: skip
    updates_run(scope_id=update.scope_id, force=True)  # rewrites it after its commit
    stored = _memory_md(alice)
    assert "User has a parrot" in stored and "User has a dog" in stored
    assert stored == render_memory_md(row, facts_snapshot(scope=row))


def test_a_crash_after_the_dream_commits_leaves_files_the_next_read_writes(
    alice, dreaming, monkeypatch
):
    from memories.engine import dreams

    def die(*args, **kwargs):
        raise KeyboardInterrupt  # the worker dies between the commit and the files

    monkeypatch.setattr(dreams, "_write_files", die)
    with pytest.raises(KeyboardInterrupt):
        dream_run(owner=alice, scope=SCOPE)
    monkeypatch.undo()
    dream = Dream.objects.get()  # committed
    assert dream.files_written is False
    assert _memory_md(alice) == dream.memory_md_before  # as the update run left it
    diary_name = files.diary_path(alice.pk, list(SCOPE), dream.created_at.date())
    assert files.read_text(diary_name) is None

    text = memory_md_read(dream.scope)  # the next read (or run) writes what was missing
    assert text == dream.memory_md_after == _memory_md(alice)
    diary = files.read_text(diary_name)
    assert diary.count(f"## Dream {dream.pk}") == 1 and dream.diary in diary
    dream.refresh_from_db()
    assert dream.files_written is True
    memory_md_read(dream.scope)
    assert files.read_text(diary_name) == diary  # written once


def test_undo_writes_back_the_saved_memory_md_and_a_diary_entry(alice, dreaming):
    dream = dream_run(owner=alice, scope=SCOPE).dream
    fact_add(owner=alice, scope=SCOPE, facts=[FactIn("User has a cat", "context", 0.9)])
    undone = dream_undo(owner=alice, dream_id=dream.pk)
    # the text saved before the dream, as it was (not rebuilt: the cat came later)
    assert _memory_md(alice) == dream.memory_md_before and "cat" not in dream.memory_md_before
    diary = files.read_text(files.diary_path(alice.pk, list(SCOPE), undone.undone_at.date()))
    entry = diary[diary.index(f"## Undo of dream {dream.pk}") :]
    assert entry.startswith(f"## Undo of dream {dream.pk} · {undone.undone_at:%H:%M:%S} UTC\n\n")
    assert "3 facts put back as they were, 1 removed, 1 changed back" in entry
    assert diary.count(f"## Dream {dream.pk}") == 1  # the dream's own entry stays
    # the next read brings it up to date with what was learned after the dream
    assert "User has a cat" in memory_md_read(dream.scope)


def test_the_admin_reads_a_dream_as_a_page_with_tables(admin_client, alice, dreaming):
    dream = dream_run(owner=alice, scope=SCOPE).dream
    page = admin_client.get(f"/admin/memory_engine/dream/{dream.pk}/change/").content.decode()
    assert f"Dream of user/alice on {dream.created_at:%Y-%m-%d}" in page
    assert "Change dream" not in page
    # The facts before and the changes as tables, not JSON.
    assert "<th>fact</th><th>category</th><th>confidence</th>" in page
    assert "<td>User likes green tea</td><td>preference</td><td>0.90</td>" in page
    assert "<th>action</th><th>before</th><th>after</th><th>result</th>" in page
    assert '"content":' not in page and "&quot;content&quot;" not in page


def test_the_engine_admin_lists_facts_with_their_scope_written_one_way(admin_client, alice,
                                                                       dreaming):  # fmt: skip
    page = admin_client.get("/admin/memory_engine/enginefact/").content.decode()
    assert "User likes tea" in page and "user/alice" in page
    for column in ("scope_label", "category", "confidence", "source", "said"):
        assert f'class="column-{column}' in page or f"column-{column}" in page, column
    assert "user,alice" not in page and "user, alice" not in page
    fact = Fact.objects.get(content="User likes tea")
    detail = admin_client.get(f"/admin/memory_engine/enginefact/{fact.pk}/change/")
    assert detail.status_code == 200 and "View fact" in detail.content.decode()
    assert admin_client.post(f"/admin/memory_engine/enginefact/{fact.pk}/delete/",
                             {"post": "yes"}).status_code == 403  # fmt: skip
    assert Fact.objects.filter(pk=fact.pk).exists()


def test_the_audit_reads_in_time_order_with_plain_captions(admin_client, alice, dreaming):
    page = admin_client.get("/admin/memories/factchange/").content.decode()
    assert "added: User likes tea" in page or "User likes tea" in page
    from memories.facts.models import FactChange

    change = FactChange.objects.filter(action="add").first()
    assert str(change) == f"added: {change.new_content}"
    assert "''" not in str(change) and "->" not in str(change)
    times = list(FactChange.objects.order_by("-created_at").values_list("pk", flat=True))
    listed = [str(pk) for pk in times]
    positions = [page.find(pk) for pk in listed if page.find(pk) >= 0]
    assert positions == sorted(positions)  # the newest first, in time order


def test_the_daily_dream_waits_for_enough_new_material(alice, dreaming, settings):
    """The idle gate (issue 29): a scope is dreamed once ENGINE_DREAM_MIN_CHANGES of its
    facts changed or flushes were processed since its last dream, not for one change."""
    from memories.engine.dreams import dream_candidates

    settings.ENGINE_DREAM_MIN_CHANGES = 3
    dreaming.dream = keep_all
    dream_run(owner=alice, scope=SCOPE)  # (the fixture's scope, dreamed: nothing new since)
    zed = ("user", "zed")
    fact_add(owner=alice, scope=zed, facts=[FactIn("User likes tea", "context", 0.9),
                                            FactIn("User hikes", "context", 0.9)])  # fmt: skip
    calls = dreaming.calls["dream"]
    assert dream_candidates() == [] and dreams_daily() == 0  # two changes: not yet
    fact_add(owner=alice, scope=zed, facts=[FactIn("User reads sci-fi", "context", 0.9)])
    row = scope_find(owner=alice, scope=zed)
    assert dream_candidates() == [(alice.pk, row.pk)]
    assert dreams_daily() == 1 and dreaming.calls["dream"] == calls + 1
    assert dream_candidates() == []  # counted again from the dream on
