"""The contract suite: every LLM consumer (extraction, dream, query rewrite, summary) fed
the answer styles models really produce (``tests/contract/corpus.py``). For each: what
is learned; an unreadable answer is asked again once with the strict format, then shown
(the update ``malformed`` with its reason and the answer's start, counted, logged) and
loses no message. The tool loop's are in ``test_tool_answers.py``."""

from __future__ import annotations

import json
import logging
import re

import pytest

from core.models import MetricCounter
from core.providers.json_answer import MalformedAnswer
from core.providers.llm import get_llm
from ingestion.updates import updates_run
from knowledge.rewrite import rewrite_queries
from memories.conversations.models import ConversationSummary
from memories.conversations.summaries import SummaryMessage, summary_fold
from memories.engine import files
from memories.engine.dreams import DreamTooLossy, dream_run
from memories.engine.models import Dream, FormationRun, PendingUpdate
from memories.engine.updates import update_record
from memories.facts.scopes import scope_ensure, scope_find
from memories.facts.selectors import fact_list, facts_snapshot
from memories.facts.services import FactIn, fact_add
from tests.contract.corpus import GARBAGE, REFUSAL, UNREADABLE, dumps, wrap
from tests.fakes.openai_server import Scripted, chat_body

pytestmark = pytest.mark.django_db
SCOPE = ("user", "alice")
TEA = "I drink green tea every morning"
FACT = "User drinks green tea every morning"
RUST = "User is learning Rust"


@pytest.fixture
def upstream(llm_settings, openai_server, engine_storage):
    """The scripted upstream answering every chat with ``answer`` (a text, or a function
    of the prompt)."""

    def answering(answer):
        def respond(payload):
            prompt = "\n".join(str(m.get("content")) for m in payload["messages"])
            return Scripted(body=chat_body(answer(prompt) if callable(answer) else answer))

        openai_server.chat_fn = respond

    return answering


def _counter(name: str) -> int:
    return MetricCounter.objects.filter(name=name).values_list("value", flat=True).first() or 0


def _facts(owner) -> list[tuple[str, str, float]]:
    row = scope_find(owner=owner, scope=SCOPE)
    facts = fact_list(scope=row) if row else []
    return sorted((f.content, f.category, round(f.confidence, 2)) for f in facts)


def _chats(server) -> list[dict]:
    return [r["json"] for r in server.requests if r["path"].endswith("/chat/completions")]


# --- extraction ---------------------------------------------------------------------
CORRECT = dumps({"newFacts": [{"content": FACT, "category": "behavior", "confidence": 0.95,
                               "replaces": None, "sources": []}], "factsToRemove": []})  # fmt: skip
LEARNED = [(FACT, "behavior", 0.95)]
DEFAULTED = [(FACT, "context", 0.7)]  # no category: context; no confidence: the documented 0.7
EXTRACTIONS = [
    *((style, answer, LEARNED) for style, answer in wrap(CORRECT)),
    ("variant-key-facts", dumps({"facts": [{"fact": FACT, "type": "habit", "confidence": 0.95}]}),
     LEARNED),
    ("variant-key-memories-strings", dumps({"memories": [FACT]}), DEFAULTED),
    ("variant-key-nested", dumps({"result": {"new_facts": [{"text": FACT, "category": "behavior",
                                                           "score": 0.95}]}}), LEARNED),
    ("bare-list", dumps([{"content": FACT, "category": "behavior", "confidence": 0.95}]), LEARNED),
    ("bare-list-of-strings", dumps([FACT]), DEFAULTED),
    ("one-object", dumps({"content": FACT, "category": "behavior", "confidence": 0.95}), LEARNED),
    ("json-lines", dumps({"content": FACT, "category": "behavior", "confidence": 0.95}) + "\n"
     + dumps({"content": RUST, "category": "goal", "confidence": 0.9}),
     [*LEARNED, (RUST, "goal", 0.9)]),
    ("missing-fields", dumps({"newFacts": [{"content": FACT}]}), DEFAULTED),
    ("extra-fields", dumps({"newFacts": [{"content": FACT, "category": "behavior",
                                          "confidence": 0.95, "importance": "high",
                                          "tags": ["tea"]}], "reasoning": "a daily habit"}),
     LEARNED),
    ("wrong-types", dumps({"newFacts": [{"content": FACT, "category": "Habits",
                                         "confidence": "95%", "sources": "m-1", "replaces": 0}],
                           "factsToRemove": None}), LEARNED),
    ("confidence-as-string", dumps({"newFacts": [{"content": FACT, "category": "behavior",
                                                  "confidence": "0.95"}]}), LEARNED),
    ("unknown-category", dumps({"newFacts": [{"content": FACT, "category": "beverages",
                                              "confidence": 0.95}]}), [(FACT, "context", 0.95)]),
    ("single-quotes-trailing-commas",
     "{'newFacts': [{'content': '" + FACT + "', 'category': 'behavior', 'confidence': 0.95,},],}",
     LEARNED),
    ("truncated", CORRECT[: CORRECT.index("]")] + ', {"content": "User is learn', LEARNED),
    ("placeholder-beside-a-fact", dumps({"newFacts": [
        {"content": "...", "category": "preference", "confidence": 0.9},
        {"content": "preference", "confidence": 0.9},
        {"content": FACT, "category": "behavior", "confidence": 0.95}]}), LEARNED),
]  # fmt: skip


def _flush(owner) -> PendingUpdate:
    return update_record(owner=owner, scope=SCOPE, messages=[{"role": "user", "content": TEA}])


@pytest.mark.parametrize(
    ("style", "answer", "learned"), EXTRACTIONS, ids=[e[0] for e in EXTRACTIONS]
)
def test_extraction_learns_from_every_readable_style(alice, upstream, openai_server, style, answer,
                                                     learned):  # fmt: skip
    upstream(answer)
    update = _flush(alice)
    run = updates_run(scope_id=update.scope_id, force=True)
    update.refresh_from_db()
    assert (run.status, run.llm_calls, update.status, update.error) == ("done", 1, "done", "")
    assert _facts(alice) == learned
    assert update.note.startswith(f"{len(learned)} facts read: {len(learned)} add")
    assert ("no confidence on 1: 0.70 used" in update.note) == (learned == DEFAULTED)
    assert (
        FormationRun.objects.get().status == "done" and _counter("engine_llm_malformed_total") == 0
    )
    # asked with the answer's JSON Schema (auto, a local endpoint: json_schema)
    sent = _chats(openai_server)[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "memory_extraction"


@pytest.mark.parametrize("answer", ['{"newFacts": [], "factsToRemove": []}', '{"memories": []}', "[]",
                                    "```json\n{\"newFacts\": []}\n```"])  # fmt: skip
def test_a_well_formed_empty_answer_is_done_with_nothing_to_learn(alice, upstream, answer):
    upstream(answer)
    update = _flush(alice)
    run = updates_run(scope_id=update.scope_id, force=True)
    update.refresh_from_db()
    assert (run.status, run.llm_calls, update.status, update.note) == ("done", 1, "done",
                                                                       "nothing to learn")  # fmt: skip
    assert _facts(alice) == [] and update.error == "" and update.answer_excerpt == ""


EXAMPLE = ('{"newFacts": [{"content": "...", "category": "preference", "confidence": 0.9, '
           '"replaces": null, "sources": ["..."]}], "factsToRemove": []}')  # fmt: skip
UNREADABLE_EXTRACTIONS = [
    *UNREADABLE,
    ("the-prompt-s-example", EXAMPLE, "none of its 1 items could be read"),
    ("the-prompt-s-example-text", dumps({"newFacts": [{"content": "User prefers TypeScript"}]}),
     "none of its 1 items could be read"),
    ("bare-category-names", dumps({"newFacts": ["preference", "goal"]}),
     "none of its 2 items could be read"),
    ("unknown-shape", dumps({"answer": "The user drinks tea"}),
     'valid JSON without a "newFacts" list (its keys: answer)'),
    ("truncated-before-an-item", '{"newFacts": [{"content": "User dri',
     "cut off before its first complete item"),
    ("long-garbage", "x" * 900, "no JSON in the answer"),
]  # fmt: skip


@pytest.mark.parametrize(("style", "answer", "reason"), UNREADABLE_EXTRACTIONS,
                         ids=[u[0] for u in UNREADABLE_EXTRACTIONS])  # fmt: skip
def test_an_unreadable_extraction_is_malformed_visible_and_loses_nothing(
    alice, upstream, openai_server, caplog, style, answer, reason
):
    upstream(answer)
    update = _flush(alice)
    with caplog.at_level(logging.WARNING, logger="memories.decisions"):
        run = updates_run(scope_id=update.scope_id, force=True)
    update.refresh_from_db()
    assert (run.status, run.llm_calls, update.status) == ("malformed", 2, "malformed")
    assert reason in update.error and update.error == run.error
    assert update.answer_excerpt == answer[:500] and update.note == ""
    assert update.messages == [{"role": "user", "content": TEA}]  # the message is kept
    assert update.processed_at is not None and str(update.batch_id) == run.batch_id
    journal = files.journal_read(owner_id=alice.pk, scope=list(SCOPE),
                                 day=update.created_at.date())  # fmt: skip
    assert f"- **user**: {TEA}" in journal  # and a dream can still learn from it
    assert _facts(alice) == [] and _counter("engine_llm_malformed_total") == 1
    assert FormationRun.objects.get().status == "malformed"
    logged = [
        json.loads(r.message) for r in caplog.records if "engine_update_malformed" in r.message
    ]
    assert [(e["reason"], e["answer"]) for e in logged] == [(update.error, answer[:500])]
    # asked again once, with its answer, the reason and the strict format
    first, second = _chats(openai_server)
    assert second["messages"][-2] == {"role": "assistant", "content": answer}
    assert second["messages"][-1]["content"].startswith(
        f"Your previous answer was not valid JSON in the expected shape ({update.error})"
    )
    assert second["response_format"]["type"] == "json_schema"


def test_a_malformed_run_leaves_later_flushes_pending_and_the_next_run_learns(alice, upstream):
    upstream(GARBAGE)
    first = _flush(alice)
    updates_run(scope_id=first.scope_id, force=True)
    upstream(CORRECT)
    second = _flush(alice)
    run = updates_run(scope_id=second.scope_id, force=True)
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, second.status, run.updates) == ("malformed", "done", [second.pk])
    assert _facts(alice) == LEARNED
    assert sorted(FormationRun.objects.values_list("status", flat=True)) == ["done", "malformed"]


def test_the_retry_reads_a_second_answer_that_is_right(alice, upstream, openai_server):
    answers = iter([REFUSAL, dumps({"facts": [FACT]})])
    upstream(lambda prompt: next(answers))
    update = _flush(alice)
    run = updates_run(scope_id=update.scope_id, force=True)
    update.refresh_from_db()
    assert (run.status, run.llm_calls, update.status) == ("done", 2, "done")
    assert _facts(alice) == DEFAULTED and _counter("engine_llm_malformed_total") == 0


# --- dream --------------------------------------------------------------------------
def _fact_id(prompt: str) -> str:
    return re.search(r"\(id: ([0-9a-f-]+)\)", prompt).group(1)


def _dream_answer(template: str):
    return lambda prompt: template.replace("<ID>", _fact_id(prompt))


KEPT = {"id": "<ID>", "content": FACT, "category": "behavior", "confidence": 0.95, "day": None}
NEW = {"id": None, "content": RUST, "category": "goal", "confidence": 0.9, "day": None}
DREAMT = [(FACT, "behavior", 0.95), (RUST, "goal", 0.9)]
CORRECT_DREAM = dumps({"facts": [KEPT, NEW], "diary": "Added what the journal said."})
DREAMS = [
    *((style, answer, DREAMT) for style, answer in wrap(CORRECT_DREAM)),
    ("variant-key-memories", dumps({"memories": [KEPT, NEW], "summary": "x"}), DREAMT),
    ("bare-list", dumps([KEPT, NEW]), DREAMT),
    ("strings-for-facts", dumps({"facts": [FACT, RUST]}),
     [(FACT, "behavior", 0.95), (RUST, "context", 0.7)]),
    ("one-object", dumps(KEPT), [(FACT, "behavior", 0.95)]),
    ("missing-fields", dumps({"facts": [{"id": "<ID>", "content": FACT}, {"content": RUST}]}),
     [(FACT, "behavior", 0.95), (RUST, "context", 0.7)]),
    ("extra-fields", dumps({"facts": [{**KEPT, "why": "kept"}, {**NEW, "tags": []}],
                            "diary": "d", "stats": {"merged": 0}}), DREAMT),
    ("wrong-types", dumps({"facts": [KEPT, {**NEW, "confidence": "0.9", "category": "Goals",
                                            "id": "null"}]}), DREAMT),
    ("truncated", dumps({"facts": [KEPT, NEW]})[:-1] + ', "diary": "I merged two fac', DREAMT),
]  # fmt: skip


@pytest.fixture
def tea_fact(alice):
    scope = scope_ensure(owner=alice, scope=SCOPE)
    fact_add(owner=alice, scope=scope, reason="test", facts=[
        FactIn(content=FACT, category="behavior", confidence=0.95)])  # fmt: skip
    return scope


@pytest.mark.parametrize(("style", "answer", "after"), DREAMS, ids=[d[0] for d in DREAMS])
def test_a_dream_reads_every_readable_style(alice, upstream, tea_fact, style, answer, after):
    upstream(_dream_answer(answer))
    outcome = dream_run(owner=alice, scope=SCOPE)
    assert outcome.dream.llm_calls == 1 and _facts(alice) == after


def test_an_empty_dream_answer_would_drop_everything_and_is_refused(alice, upstream, tea_fact):
    upstream('{"facts": [], "diary": ""}')
    with pytest.raises(DreamTooLossy):
        dream_run(owner=alice, scope=SCOPE)
    assert _facts(alice) == [(FACT, "behavior", 0.95)] and not Dream.objects.exists()


@pytest.mark.parametrize(("style", "answer", "reason"),
                         [*UNREADABLE, ("the-prompt-s-example", dumps({"facts": [{"id": "<id or null>",
                          "content": "...", "category": "preference"}]}), "none of its 1 items")],
                         ids=[*(u[0] for u in UNREADABLE), "the-prompt-s-example"])  # fmt: skip
def test_an_unreadable_dream_is_a_502_with_the_reason_and_changes_nothing(
    alice, upstream, openai_server, tea_fact, style, answer, reason
):
    upstream(answer)
    before = facts_snapshot(scope=tea_fact)
    with pytest.raises(MalformedAnswer) as bad:
        dream_run(owner=alice, scope=SCOPE)
    assert bad.value.status_code == 502 and reason in bad.value.details["reason"]
    assert bad.value.details["answer"] == answer[:500]
    assert facts_snapshot(scope=tea_fact) == before and not Dream.objects.exists()
    assert len(_chats(openai_server)) == 2 and _counter("engine_llm_malformed_total") == 1


# --- query rewrite ------------------------------------------------------------------
QUERIES = ["Crete trip", "summer holiday island"]
CORRECT_QUERIES = dumps({"queries": QUERIES})
REWRITES = [
    *((style, answer, QUERIES) for style, answer in wrap(CORRECT_QUERIES)),
    ("variant-key", dumps({"rewritten_queries": QUERIES}), QUERIES),
    ("bare-list", dumps(QUERIES), QUERIES),
    ("objects-for-strings", dumps({"queries": [{"query": q, "rank": i} for i, q in
                                               enumerate(QUERIES)]}), QUERIES),
    ("one-string-for-the-list", dumps({"queries": "Crete trip"}), ["Crete trip"]),
    ("extra-fields", dumps({"queries": QUERIES, "reasoning": "paraphrases"}), QUERIES),
    ("wrong-types", dumps({"queries": [*QUERIES, 2024, None]}), [*QUERIES, "2024"]),
    ("truncated", CORRECT_QUERIES[: CORRECT_QUERIES.index("summer") + 6], ["Crete trip"]),
]  # fmt: skip


@pytest.mark.parametrize(("style", "answer", "queries"), REWRITES, ids=[r[0] for r in REWRITES])
def test_query_rewrite_reads_every_readable_style(upstream, settings, style, answer, queries):
    settings.SEARCH_REWRITE_QUERIES = 3
    upstream(answer)
    assert rewrite_queries("holiday", llm=get_llm()) == (queries, "fake-model")


@pytest.mark.parametrize(("style", "answer", "reason"),
                         [*UNREADABLE, ("missing-list", "{}", "without a \"queries\" list")],
                         ids=[*(u[0] for u in UNREADABLE), "missing-list"])  # fmt: skip
def test_an_unreadable_rewrite_is_asked_again_then_says_why(upstream, openai_server, style, answer,
                                                            reason):  # fmt: skip
    upstream(answer)
    with pytest.raises(ValueError, match="not JSON, twice") as error:
        rewrite_queries("holiday", llm=get_llm())
    assert reason in str(error.value) and len(_chats(openai_server)) == 2


def test_an_empty_rewrite_is_no_usable_query_without_asking_again(upstream, openai_server):
    upstream('{"queries": []}')
    with pytest.raises(ValueError, match="no usable query"):
        rewrite_queries("holiday", llm=get_llm())
    assert len(_chats(openai_server)) == 1


# --- summary (free text) ------------------------------------------------------------
SUMMARY = "Alice drinks green tea every morning and is learning Rust."
SUMMARIES = [
    ("correct", SUMMARY, SUMMARY),
    ("fenced", f"```\n{SUMMARY}\n```", SUMMARY),
    ("think-block", f"<think>Two facts.</think>\n{SUMMARY}", SUMMARY),
    ("json-for-text", dumps({"summary": SUMMARY}), SUMMARY),
    ("prose-wrapped", f"Here is the summary: {SUMMARY}", f"Here is the summary: {SUMMARY}"),
]


def _turns() -> list[SummaryMessage]:
    return [SummaryMessage(f"m{i}", "user" if i % 2 == 0 else "assistant",
                           f"message number {i} " + "word " * 20) for i in range(10)]  # fmt: skip


@pytest.mark.parametrize(("style", "answer", "stored"), SUMMARIES, ids=[s[0] for s in SUMMARIES])
def test_a_summary_reads_every_readable_style(alice, upstream, style, answer, stored):
    upstream(answer)
    result = summary_fold(owner=alice, key="k", messages=_turns(), max_tokens=150,
                          max_summary_tokens=40)  # fmt: skip
    assert result.summary == stored == ConversationSummary.objects.get().text


@pytest.mark.parametrize(("style", "answer", "reason"), UNREADABLE, ids=[u[0] for u in UNREADABLE])
def test_an_empty_or_refused_summary_stores_nothing(alice, upstream, style, answer, reason):
    if style == "garbage":  # free text: any prose is a summary
        pytest.skip("prose is a summary")
    upstream(answer)
    with pytest.raises(MalformedAnswer) as bad:
        summary_fold(owner=alice, key="k", messages=_turns(), max_tokens=150, max_summary_tokens=40)
    assert bad.value.status_code == 502 and not ConversationSummary.objects.exists()
    assert reason.replace("no JSON in", "nothing in") in bad.value.details["reason"]
