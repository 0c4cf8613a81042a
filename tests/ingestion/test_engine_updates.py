"""Debounced updates: flushes of a scope within the window make one extraction; the
flushes live in Postgres; a run is all-or-nothing and safe to repeat."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import Schedule

from ingestion.tasks import engine_updates_sweep, form_memories
from ingestion.updates import updates_now, updates_run, updates_sweep
from memories.engine import files
from memories.engine.models import PendingUpdate
from memories.engine.updates import schedule_name, update_record
from memories.facts.models import Fact, FactChange
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_list
from memories.facts.services import FactIn, fact_add
from tests.fakes.openai_server import Scripted, chat_body
from tests.ingestion.conftest import DARK, RUST, TEA
from tests.memories.engine.scripted import fact, scope_held

pytestmark = pytest.mark.django_db
SCOPE = ("user", "alice")


def _facts(owner):
    row = scope_find(owner=owner, scope=SCOPE)
    return sorted(
        (v.content, v.category, v.confidence, v.source_kind) for v in fact_list(scope=row)
    )


def test_three_flushes_in_the_window_cost_one_extraction(alice, engine_llm):
    t0 = timezone.now()
    updates = [
        update_record(
            owner=alice,
            scope=SCOPE,
            messages=[{"role": "user", "content": text}],
            now=t0 + timedelta(seconds=i * 10),
        )  # fmt: skip
        for i, text in enumerate([TEA, RUST, DARK])
    ]
    assert engine_llm.calls["extraction"] == 0  # nothing ran at flush time
    # trailing edge: the window closes 30 s after the newest flush
    assert [u.due_at for u in updates] == [t0 + timedelta(seconds=30 + 10 * i) for i in range(3)]
    schedule = Schedule.objects.get(name=schedule_name(updates[0].scope_id))
    assert (schedule.func, schedule.args, schedule.next_run) == (
        "ingestion.tasks.engine_updates_run", str(updates[0].scope_id), t0 + timedelta(seconds=50),
    )  # fmt: skip

    early = updates_run(scope_id=updates[0].scope_id, now=t0 + timedelta(seconds=45))
    assert (early.status, engine_llm.calls["extraction"]) == ("not_due", 0)

    run = updates_run(scope_id=updates[0].scope_id, now=t0 + timedelta(seconds=50))
    assert (run.status, run.llm_calls, engine_llm.calls["extraction"]) == ("done", 1, 1)
    prompt = engine_llm.prompts["extraction"][0]
    u1, u2, u3 = (u.pk for u in updates)
    assert (
        f"[flush:{u1}] user: {TEA}\n[flush:{u2}] user: {RUST}\n[flush:{u3}] user: {DARK}" in prompt
    )
    assert _facts(alice) == [
        ("User drinks green tea every morning", "behavior", 0.95, "message"),
        ("User is learning Rust", "goal", 0.9, "message"),
        ("User prefers dark mode", "preference", 0.98, "message"),
    ]  # the 0.4 guess is below the 0.7 threshold
    assert [d.action for d in run.decisions] == ["add", "add", "below_threshold", "add"]
    rows = PendingUpdate.objects.order_by("id")
    assert {(r.status, str(r.batch_id), r.attempts) for r in rows} == {("done", run.batch_id, 1)}
    reasons = set(FactChange.objects.values_list("reason", flat=True))
    assert reasons == {f"debounced update {run.batch_id} (3 flushes)"}

    # a second run (a duplicate delivery) finds nothing to do and calls nothing
    again = updates_run(scope_id=updates[0].scope_id, now=t0 + timedelta(minutes=5), force=True)
    assert (again.status, engine_llm.calls["extraction"]) == ("empty", 1)
    assert Fact.objects.count() == 3


def test_the_journal_gets_one_entry_per_flush_and_never_twice(alice, engine_llm, settings):
    t0 = timezone.now().replace(hour=9, minute=0, second=0, microsecond=0)
    for text in (TEA, RUST):
        update_record(owner=alice, scope=SCOPE, messages=[
            {"role": "user", "content": text}, {"role": "assistant", "content": "Noted."},
        ], now=t0)  # fmt: skip
    update_record(
        owner=alice,
        scope=SCOPE,
        messages=[{"role": "user", "content": TEA}, {"role": "assistant", "content": "Noted."}],
        now=t0,
    )  # fmt: skip  (a retry)
    scope_id = PendingUpdate.objects.first().scope_id
    run = updates_run(scope_id=scope_id, force=True)
    assert run.journal_entries == 2  # the retried flush has the same hash
    row = scope_find(owner=alice, scope=SCOPE)
    day = PendingUpdate.objects.first().created_at.date()
    text = files.journal_read(owner_id=alice.pk, scope=row.path, day=day)
    assert text.startswith(f"# Journal · user/alice · {day.isoformat()}\n\n## ")
    assert text.count("<!-- entry ") == 2
    assert f"- **user**: {TEA}\n- **assistant**: Noted.\n" in text
    assert f"- **user**: {RUST}\n" in text
    # appending the same entry again (a re-run after a crash) changes nothing
    at = PendingUpdate.objects.first().created_at
    assert not files.journal_append(owner_id=alice.pk, scope=row.path, at=at, source="api",
                                    messages=[{"role": "user", "content": TEA},
                                              {"role": "assistant", "content": "Noted."}])  # fmt: skip
    assert files.journal_read(owner_id=alice.pk, scope=row.path, day=day) == text


def test_debounce_zero_runs_at_once(
    alice, engine_llm, settings, django_capture_on_commit_callbacks
):
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 0
    with django_capture_on_commit_callbacks(execute=True):  # queued once the flush commits
        update = update_record(
            owner=alice, scope=SCOPE, messages=[{"role": "user", "content": TEA}]
        )
    update.refresh_from_db()
    assert update.status == "done" and engine_llm.calls["extraction"] == 1
    assert not Schedule.objects.filter(name__startswith="engine-updates:").exists()
    assert [f[0] for f in _facts(alice)] == ["User drinks green tea every morning"]


def test_a_scope_that_keeps_flushing_is_extracted_within_the_max_wait(alice, engine_llm, settings):
    settings.MEMORY_UPDATE_MAX_WAIT_SECONDS = 60
    t0 = timezone.now()
    dues = [
        update_record(
            owner=alice,
            scope=SCOPE,
            messages=[{"role": "user", "content": f"m{i}"}],
            now=t0 + timedelta(seconds=20 * i),
        ).due_at  # fmt: skip
        for i in range(5)
    ]
    assert dues == [t0 + timedelta(seconds=s) for s in (30, 50, 60, 60, 80)]
    # the 5th flush came after the cap (60 s after the oldest), so it is due at once + 30 s


def test_chat_proxy_messages_in_a_row_make_one_extraction(alice, engine_llm):
    """What the chat proxy queues per answer (``form_memories``) joins the queue."""
    for text in (TEA, RUST, DARK):
        form_memories(alice.pk, "alice", text, timezone.now().isoformat())
    assert PendingUpdate.objects.filter(status="pending", source="chat").count() == 3
    assert engine_llm.calls["extraction"] == 0
    [scope_id] = set(PendingUpdate.objects.values_list("scope_id", flat=True))
    updates_run(scope_id=scope_id, force=True)
    assert engine_llm.calls["extraction"] == 1 and len(_facts(alice)) == 3


def test_sweep_runs_due_scopes_only(alice, bob, engine_llm):
    past = timezone.now() - timedelta(minutes=5)
    update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": TEA}], now=past)
    update_record(owner=bob, scope=SCOPE, messages=[{"role": "user", "content": RUST}])  # not due
    assert engine_updates_sweep() == 1  # queued and (sync in tests) run
    assert engine_llm.calls["extraction"] == 1
    assert list(PendingUpdate.objects.order_by("id").values_list("owner__username", "status")) == [
        ("alice", "done"), ("bob", "pending"),
    ]  # fmt: skip
    assert _facts(alice)[0][0] == "User drinks green tea every morning"
    assert (
        scope_find(owner=bob, scope=SCOPE) is not None
        and Fact.objects.filter(owner=bob).count() == 0
    )
    # a week later the processed flush is forgotten; the pending one is not
    updates_sweep(now=timezone.now() + timedelta(days=7, minutes=1))
    assert list(PendingUpdate.objects.values_list("owner__username", "status")) == [
        ("bob", "pending")
    ]


def test_llm_failure_keeps_the_flushes_and_backs_off_then_gives_up(
    alice, engine_llm, openai_server, settings
):
    settings.MEMORY_UPDATE_MAX_ATTEMPTS = 2
    openai_server.chat_fn = lambda payload: Scripted(
        status=500, body={"error": {"message": "down"}}
    )
    update = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": TEA}])
    now = timezone.now()
    first = updates_run(scope_id=update.scope_id, now=now, force=True)
    update.refresh_from_db()
    assert first.status == "failed" and (update.status, update.attempts) == ("pending", 1)
    assert update.due_at == now + timedelta(seconds=60) and "down" in update.error
    assert Fact.objects.count() == 0 and FactChange.objects.count() == 0
    second = updates_run(scope_id=update.scope_id, now=now + timedelta(seconds=61))
    update.refresh_from_db()
    assert second.status == "gave_up" and (update.status, update.attempts) == ("failed", 2)
    assert update.messages == [{"role": "user", "content": TEA}]  # kept, with what it said


def test_runs_a_client_asks_for_during_the_back_off_do_not_use_up_the_attempts(
    alice, engine_llm, openai_server, settings
):
    """A flush, then five ``infer: true`` adds within a second of an outage: each ran
    the scope's pending flushes and counted a failure for all of them at the batch's
    highest count, so the fifth gave up on all six, the newest after its one try."""
    settings.MEMORY_UPDATE_MAX_ATTEMPTS = 5
    openai_server.chat_fn = lambda payload: Scripted(
        status=500, body={"error": {"message": "down"}}
    )
    first = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": TEA}])
    for i in range(5):
        _, run = updates_now(owner=alice, scope=SCOPE,
                             messages=[{"role": "user", "content": f"{DARK} ({i})"}])  # fmt: skip
        assert run.status == "failed"
    rows = PendingUpdate.objects.order_by("id").values_list("status", "attempts")
    assert list(rows) == [("pending", 1)] * 6
    # the scheduled retries, each once the back-off has passed, count: 1, 2, 4, 8 minutes
    now = timezone.now()
    for minutes, status in ((1, "failed"), (3, "failed"), (7, "failed"), (15, "gave_up")):
        assert updates_run(scope_id=first.scope_id, now=now + timedelta(minutes=minutes,
                                                                        seconds=5)).status == status  # fmt: skip
    assert list(rows.all()) == [("failed", 5)] * 6
    assert PendingUpdate.objects.get(pk=first.pk).messages == [{"role": "user", "content": TEA}]


def test_malformed_json_is_repaired_by_one_retry(alice, engine_llm, openai_server):
    answers = iter([Scripted(body={"choices": [{"message": {"content": "Sure! Here are facts"}}]})])

    def respond(payload):
        return next(answers, None) or engine_llm(payload)

    openai_server.chat_fn = respond
    update = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": DARK}])
    run = updates_run(scope_id=update.scope_id, force=True)
    assert run.llm_calls == 2 and [f[0] for f in _facts(alice)] == ["User prefers dark mode"]


def test_two_runs_of_one_scope_never_overlap(alice, engine_llm):
    update = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": TEA}])
    with scope_held(update.scope_id):
        busy = updates_run(scope_id=update.scope_id, force=True)
    assert busy.status == "busy" and engine_llm.calls["extraction"] == 0
    update.refresh_from_db()
    assert update.status == "pending"
    assert updates_run(scope_id=update.scope_id, force=True).status == "done"


def test_invalid_flush_writes_nothing(alice, engine_llm):
    from core.errors import InvalidInput

    for bad in ([], [{"role": "robot", "content": "x"}], [{"role": "user", "content": " "}], "hi"):
        with pytest.raises(InvalidInput):
            update_record(owner=alice, scope=SCOPE, messages=bad)
    assert PendingUpdate.objects.count() == 0 and scope_find(owner=alice, scope=SCOPE) is None


def test_facts_name_the_messages_they_come_from(alice, engine_llm):
    """A fact's source is the message(s) it was learned from: the ids a flush gives its
    messages (those the extraction names in "sources", else all of the batch), or
    ``flush:<update id>`` for a flush whose messages have none."""
    engine_llm.extractions = {
        TEA: [fact("User drinks green tea every morning", "behavior", 0.95, sources=["m-2"])],
        DARK: [fact("User prefers dark mode", "preference", 0.98)],  # names no source
        RUST: [fact("User is learning Rust", "goal", 0.9, sources=["nope"])],  # unknown: all
    }
    update_record(owner=alice, scope=SCOPE, messages=[
        {"role": "assistant", "content": "How do you start your day?", "id": "m-1"},
        {"role": "user", "content": TEA, "id": "m-2"},
        {"role": "user", "content": DARK, "id": 3},
    ])  # fmt: skip
    bare = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": RUST}])
    run = updates_run(scope_id=bare.scope_id, force=True)
    assert run.llm_calls == 1
    prompt = engine_llm.prompts["extraction"][0]
    assert f"[m-2] user: {TEA}" in prompt and f"[flush:{bare.pk}] user: {RUST}" in prompt
    row = scope_find(owner=alice, scope=SCOPE)
    sources = {v.content: (v.source_kind, v.source_ref) for v in fact_list(scope=row)}
    assert sources == {
        "User drinks green tea every morning": ("message", "m-2"),
        "User prefers dark mode": ("message", f"m-1,m-2,3,flush:{bare.pk}"),
        "User is learning Rust": ("message", f"m-1,m-2,3,flush:{bare.pk}"),
    }


@pytest.mark.parametrize("bad", [{"x": 1}, "", "a,b", "x" * 256, True])
def test_a_bad_message_id_is_400_and_writes_nothing(alice, engine_llm, bad):
    from core.errors import InvalidInput

    with pytest.raises(InvalidInput) as error:
        update_record(owner=alice, scope=SCOPE,
                      messages=[{"role": "user", "content": TEA, "id": bad}])  # fmt: skip
    assert error.value.details == {
        "messages[0].id": ["must be a string (1-255 characters, no comma) or a number"]
    }
    assert PendingUpdate.objects.count() == 0


def test_a_client_can_have_pending_messages_learned_now_and_wait(
    alice, alice_client, bob_client, engine_llm
):
    flushed = alice_client.post("/api/v1/engine/flush", {"scope": list(SCOPE), "messages": [
        {"role": "user", "content": TEA}]}, format="json")  # fmt: skip
    assert flushed.status_code == 202 and engine_llm.calls["extraction"] == 0  # its window: 30 s
    body = {"scope": list(SCOPE)}
    assert bob_client.post("/api/v1/engine/updates/run", body, format="json").status_code == 404
    ran = alice_client.post("/api/v1/engine/updates/run", body, format="json")
    assert ran.status_code == 200, ran.content
    result = ran.json()
    assert (result["scope"], result["status"], result["updates"]) == (list(SCOPE), "done", 1)
    assert [(d["content"], d["action"]) for d in result["decisions"]] == [
        ("User drinks green tea every morning", "add")
    ]
    assert engine_llm.calls["extraction"] == 1
    assert set(PendingUpdate.objects.values_list("status", flat=True)) == {"done"}
    again = alice_client.post("/api/v1/engine/updates/run", body, format="json").json()
    assert (again["status"], again["decisions"], engine_llm.calls["extraction"]) == ("empty", [], 1)
    unknown = alice_client.post("/api/v1/engine/updates/run", {"scope": ["user", "nobody"]},
                                format="json")  # fmt: skip
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "scope_not_found"


def test_a_run_now_answers_what_it_removed_and_why_it_failed(
    alice, alice_client, engine_llm, openai_server
):
    """The run answered its additions only: a fact the messages made untrue was removed
    unsaid (the users API lists it as a delete), and a failed run said no reason."""
    [tea] = fact_add(
        owner=alice, scope=SCOPE, facts=[FactIn("User drinks green tea every morning")]
    )
    answer = {"newFacts": [], "factsToRemove": [{"id": tea.fact_id}]}
    openai_server.chat_fn = lambda payload: Scripted(body=chat_body(json.dumps(answer)))
    body = {"scope": list(SCOPE), "messages": [{"role": "user", "content": "I quit tea."}]}
    assert alice_client.post("/api/v1/engine/flush", body, format="json").status_code == 202
    ran = alice_client.post("/api/v1/engine/updates/run", {"scope": list(SCOPE)}, format="json")
    result = ran.json()
    assert (result["status"], result["error"]) == ("done", "")
    assert [(d["action"], d["content"], d["target_id"]) for d in result["decisions"]] == [
        ("delete", "User drinks green tea every morning", tea.fact_id)
    ]
    assert not Fact.objects.filter(pk=tea.fact_id).exists()

    openai_server.chat_fn = lambda payload: Scripted(status=400, body={"error": {"message": "no"}})
    assert alice_client.post("/api/v1/engine/flush", body, format="json").status_code == 202
    ran = alice_client.post("/api/v1/engine/updates/run", {"scope": list(SCOPE)}, format="json")
    result = ran.json()
    assert (result["status"], result["decisions"]) == ("failed", [])
    assert result["error"] == "provider answered 400: Error code: 400 - no"


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "ok"}],
        [{"role": "user", "content": "Thanks!! 👍"}, {"role": "user", "content": "yes please"}],
        [{"role": "assistant", "content": "I can help you plan a trip to Lisbon."}],
        [{"role": "user", "content": "lol"}, {"role": "assistant", "content": "Glad it helped."}],
    ],
)
def test_a_flush_with_nothing_to_learn_costs_no_llm_call(alice, engine_llm, messages):
    """The extraction's idle gate (issue 29): acknowledgements only, or assistant messages
    only: done at once, noted, journaled, no LLM call."""
    t0 = timezone.now()
    update = update_record(owner=alice, scope=SCOPE, messages=messages, now=t0)
    run = updates_run(scope_id=update.scope_id, now=t0 + timedelta(seconds=31))
    assert (run.status, run.llm_calls, engine_llm.calls["extraction"]) == ("done", 0, 0)
    update.refresh_from_db()
    assert (update.status, update.note) == ("done", "nothing to learn (idle gate: no extraction)")
    assert run.journal_entries == 1 and _facts(alice) == []


def test_one_learnable_message_sends_the_whole_batch(alice, engine_llm, settings):
    t0 = timezone.now()
    update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": "ok"}], now=t0)
    update = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": TEA}],
                           now=t0 + timedelta(seconds=1))  # fmt: skip
    run = updates_run(scope_id=update.scope_id, now=t0 + timedelta(seconds=32))
    assert (run.status, run.llm_calls, len(run.updates)) == ("done", 1, 2)
    # The gate off: acknowledgements go to the LLM as before.
    settings.ENGINE_EXTRACTION_GATE = False
    update = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": "ok"}],
                           now=t0 + timedelta(minutes=5))  # fmt: skip
    run = updates_run(scope_id=update.scope_id, now=t0 + timedelta(minutes=6))
    assert (run.status, run.llm_calls) == ("done", 1)
