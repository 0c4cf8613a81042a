"""Debounced updates, the processing side: one LLM extraction for every pending flush of
a scope, then the facts written and the flushes marked done in one transaction.

A run holds the scope's run lock for its whole length, so two runs of one scope never
overlap (a second one leaves at once; the sweep comes back). The LLM call happens with
no transaction open. An erasure of the scope does not wait for that lock (nor for the
LLM), so once the LLM answered, the run writes anything (rows, the journal, MEMORY.md)
only in a transaction holding the lock every erasure takes (``scope_held_if_there``),
after it found the scope and its flushes still there: an erasure that came first left
nothing to write for, one that comes later waits and deletes what was written. The
journal entries are written in that transaction, before its commit: a crash after them
leaves the flushes pending, and the next run finds each entry already there (same hash)
and does not append it twice. A crash anywhere before the commit leaves the flushes
pending and no fact written; after it, nothing is pending. So a killed worker loses
nothing and a re-run does nothing twice.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from core.metrics import counter_add
from core.providers.embeddings import Embedder, get_embedder
from core.providers.errors import ProviderError
from core.providers.json_answer import Field, ListSpec, Reading, Shape
from core.providers.llm import ChatLLM, get_llm
from core.times import storable
from core.tracing import annotate, span, traceparent
from core.usage import budget_spent, usage_for, usage_subject_erase
from ingestion.erasure import queued_turns
from memories.engine import files
from memories.engine.dreams import memory_md_sync
from memories.engine.llm import (
    CATEGORY,
    CONFIDENCE,
    CONTENT,
    FACT_PLACEHOLDERS,
    PrecomputedEmbedder,
    json_calls,
)
from memories.engine.locks import scope_run_lock, scope_run_lock_waiting
from memories.engine.models import FormationRun, PendingUpdate
from memories.engine.updates import (
    FEATURE,
    due_scopes_of_owners,
    pending_of,
    schedule_run,
    update_record,
    validate_messages,
)
from memories.facts.models import Scope
from memories.facts.scopes import ScopePath, scope_ensure
from memories.facts.selectors import FactNotFound, ScopeNotFound, fact_list
from memories.facts.services import (
    MAX_FACT_CHARS,
    FactDecision,
    FactIn,
    fact_add,
    fact_delete,
    scope_held_if_there,
)

logger = logging.getLogger("memories.decisions")

INLINE_WAIT_SECONDS = 30.0  # how long ``updates_now`` waits for a run of the scope to end
BATCH_MAX_UPDATES = 200  # flushes folded into one extraction; the rest go to the next run
FACTS_IN_PROMPT = 100
MAX_NEW_FACTS = 20

EXTRACTION_PROMPT = """You maintain the long-term memory of one scope ({scope}). Read the conversation below and decide what should be remembered for future conversations.

Current facts (id | category | confidence | content):
{facts}

Conversation, oldest first (each line starts with the reference of its message in brackets):
{conversation}

Instructions:
1. Extract durable facts about the user or the work: preferences, knowledge, context, behavior, goals, and corrections of earlier facts. Ignore small talk and one-off requests.
2. Each fact is one concise standalone sentence (e.g. "User prefers TypeScript").
3. category is one of: preference, knowledge, context, behavior, goal, correction.
4. confidence is from 0 to 1: 0.9 or more for explicit statements, 0.7-0.9 for strong implications, less for guesses.
5. A fact that contradicts or refines a current fact names that fact's id in "replaces". Do not repeat a current fact.
6. Ids of current facts the conversation shows are no longer true go in "factsToRemove".
7. "sources" lists the references (the bracketed ones) of the messages a fact comes from.
8. "valid_from" is the date (YYYY-MM-DD) from which a fact is true in the world when the conversation says so ("I moved to Porto in March 2026": "2026-03-01"), else null.

Answer with the JSON object only:
{{"newFacts": [{{"content": "...", "category": "preference", "confidence": 0.9, "replaces": null, "sources": ["..."], "valid_from": null}}], "factsToRemove": []}}"""


# The extraction answer: the documented shape, and the variants models write (list keys,
# field names). A fact without a confidence gets ENGINE_MIN_CONFIDENCE (the lowest kept),
# and the update's note says how many did.
EXTRACTION = Shape(
    "memory_extraction",
    (
        ListSpec(
            "newFacts",
            ("facts", "memories", "new_memories", "extracted_facts", "user_facts", "facts_to_add",
             "add", "items", "results", "entries"),
            (CONTENT, CATEGORY, CONFIDENCE,
             Field("replaces", "ref", ("replace", "replaces_id", "replaced_id", "supersedes")),
             Field("sources", "texts", ("source", "refs", "references", "source_refs",
                                        "message_ids", "evidence")),
             Field("valid_from", "ref", ("valid_since", "since", "valid_at", "true_from"))),
        ),
        ListSpec(
            "factsToRemove",
            ("facts_to_remove", "remove", "removals", "to_remove", "delete", "deletions",
             "obsolete", "outdated", "forget", "removed"),
            text_keys=("id", "fact_id"),
        ),
    ),
    example='{"newFacts": [{"content": "...", "category": "preference", "confidence": 0.9, '
    '"replaces": null, "sources": ["..."], "valid_from": null}], "factsToRemove": []}',
    placeholders=FACT_PLACEHOLDERS,
    examples=(("User prefers TypeScript", "typescript"),),
)  # fmt: skip
NOTHING_TO_LEARN = "nothing to learn"


@dataclass
class UpdateRun:
    """What one run did (for the task's result, the logs and the tests)."""

    scope_id: int
    status: str  # done | not_due | busy | empty | failed | gave_up | malformed | deferred
    updates: list[int] = field(default_factory=list)
    batch_id: str | None = None
    llm_calls: int = 0
    decisions: list[FactDecision] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    removed_content: dict[str, str] = field(default_factory=dict)
    journal_entries: int = 0
    error: str = ""
    note: str = ""


def message_ref(row: PendingUpdate, message: dict[str, Any]) -> str:
    """A message's reference, a fact's ``source_ref``: the id the proxy recorded it
    under or the client flushed it with; ``flush:<update id>`` for a message without."""
    return str(message.get("id") or f"flush:{row.pk}")


def _conversation(rows: list[PendingUpdate]) -> tuple[str, list[str], dict[str, datetime]]:
    """The conversation shown to the model, its message references, and when each was
    said (its ``at``, else when its flush came: the latest of a reference's messages)."""
    lines: list[str] = []
    refs: list[str] = []
    said: dict[str, datetime] = {}
    for row in rows:
        for message in row.messages:
            ref = message_ref(row, message)
            lines.append(f"[{ref}] {message['role']}: {message['content']}")
            if ref not in refs:
                refs.append(ref)
            # (no later than its flush came: an `at` in the future is not when it was said)
            at = min(_said_at(message.get("at")) or row.created_at, row.created_at)
            said[ref] = max(said.get(ref, at), at)
    return "\n".join(lines), refs, said


def _named(named: Any, refs: list[str]) -> list[str]:
    """The references a fact names that are the batch's (all of the batch's when it
    names none)."""
    wanted = [str(r) for r in named if str(r) in refs] if isinstance(named, list) else []
    return list(dict.fromkeys(wanted or refs))


def _source_ref(named: Any, refs: list[str]) -> str:
    """The references a fact names that are the batch's (all of the batch's when it names
    none), joined by commas within the column's 255 characters."""
    out = ""
    for ref in _named(named, refs):
        joined = f"{out},{ref}" if out else ref
        if len(joined) > 255:
            break
        out = joined
    return out


def _fact_lines(scope: Scope) -> tuple[str, dict[str, str]]:
    facts = list(fact_list(scope=scope)[:FACTS_IN_PROMPT])
    lines = [f"{f.pk} | {f.category} | {f.confidence:.2f} | {f.content}" for f in facts]
    return ("\n".join(lines) or "(none yet)"), {str(f.pk): f.content for f in facts}


@dataclass
class ExtractionPrompt:
    """The extraction asked of the LLM for a batch: its messages, the conversation it
    shows, the batch's message references and the current facts it lists (id -> text)."""

    messages: list[dict[str, str]]
    conversation: str
    refs: list[str]
    known: dict[str, str]
    said: dict[str, datetime] = field(default_factory=dict)  # a reference: when it was said


def extraction_prompt(scope: Scope, rows: list[PendingUpdate]) -> ExtractionPrompt:
    listing, known = _fact_lines(scope)
    conversation, refs, said = _conversation(rows)
    prompt = EXTRACTION_PROMPT.format(
        scope="/".join(scope.path), facts=listing, conversation=conversation
    )
    return ExtractionPrompt(
        [{"role": "system", "content": prompt}], conversation, refs, known, said
    )


@dataclass
class Extracted:
    facts: list[FactIn]
    removed: list[str]
    defaulted: int = 0  # facts given no confidence: ENGINE_MIN_CONFIDENCE used


def _valid_from(value: Any) -> datetime | None:
    """A fact's ``valid_from`` as the model wrote it (a date or a time), None when it is
    missing or unreadable (the fact is kept without it)."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        when = parse_datetime(value.strip()) or _midnight(parse_date(value.strip()))
    except ValueError:
        return None
    when = _storable(when)
    return when.astimezone(UTC) if when is not None else None


def _storable(when: datetime | None) -> datetime | None:
    """``when`` with a zone (UTC when it has none), or None when it is none or the
    database cannot store it (core.times)."""
    if when is None:
        return None
    when = when if timezone.is_aware(when) else timezone.make_aware(when, UTC)
    return when if storable(when) else None


def _midnight(day: date | None) -> datetime | None:
    return None if day is None else datetime(day.year, day.month, day.day)


def parse_extraction(
    value: dict[str, Any],
    known: set[str] | dict[str, str],
    refs: list[str] | None = None,
    said: dict[str, datetime] | None = None,
) -> Extracted:
    """The facts and removals of a read extraction answer (``EXTRACTION``'s value):
    a fact without a confidence gets ``ENGINE_MIN_CONFIDENCE`` (counted in
    ``defaulted``), one without a category "context"; a ``replaces`` or removal naming
    no current fact is dropped. A fact's source is the messages (``refs``) it names in
    ``sources``, or every message of the batch; it was observed when the last of them
    was said (``said``; a backfilled conversation's ``at``: not when the run came)."""
    items = (value.get("newFacts") or [])[:MAX_NEW_FACTS]
    facts: list[FactIn] = []
    times = said or {}
    for item in items:
        confidence = item.get("confidence")
        replaces = item.get("replaces") or ""
        when = [times[r] for r in _named(item.get("sources"), refs or []) if r in times]
        facts.append(FactIn(content=item["content"][:MAX_FACT_CHARS],
                            category=item.get("category") or "context",
                            confidence=settings.ENGINE_MIN_CONFIDENCE if confidence is None else confidence,
                            source_kind="message", source_ref=_source_ref(item.get("sources"), refs or []),
                            replaces=replaces if replaces in known else None,
                            valid_from=_valid_from(item.get("valid_from")),
                            observed_at=max(when) if when else None))  # fmt: skip
    removed = [r for r in dict.fromkeys(value.get("factsToRemove") or []) if r in known]
    defaulted = sum(1 for item in items if item.get("confidence") is None)
    return Extracted(facts, removed, defaulted)


def updates_run(
    *,
    scope_id: int,
    now: datetime | None = None,
    force: bool = False,
    llm: ChatLLM | None = None,
    embedder: Embedder | None = None,
) -> UpdateRun:
    """Extract and store what the scope's pending flushes say, once they are due.

    Not due yet (a newer flush pushed the window back; ``force`` ignores it), another
    run of the scope in progress, or nothing pending: nothing happens. A provider
    failure keeps the flushes pending, retried later with a growing delay, and after
    ``MEMORY_UPDATE_MAX_ATTEMPTS`` marks them failed (kept, with the error).
    """
    now = now or timezone.now()
    with scope_run_lock(scope_id) as taken:
        if not taken:
            return UpdateRun(scope_id, "busy")
        rows = list(pending_of(scope_id).select_related("scope").order_by("id")[:BATCH_MAX_UPDATES])
        if not rows:
            return UpdateRun(scope_id, "empty")
        if not force and rows[-1].due_at > now:
            return UpdateRun(scope_id, "not_due", [r.pk for r in rows])
        spent = budget_spent(rows[0].scope.owner_id, "extraction", what=f"scope {scope_id}",
                             now=now)  # fmt: skip
        if spent is not None:
            return _defer(rows, spent.resets_at)
        return _run(rows, now, llm, embedder)


def _defer(rows: list[PendingUpdate], until: datetime) -> UpdateRun:
    """The owner's budget is spent: the scope's pending flushes wait, due when it resets
    (the sweep leaves them be until then), and its run is scheduled for that time."""
    scope_id = rows[0].scope_id
    pending_of(scope_id).update(due_at=until)
    schedule_run(scope_id, until, owner_id=rows[0].owner_id)
    return UpdateRun(scope_id, "deferred", [r.pk for r in rows], note=f"until {until.isoformat()}")


def updates_now(
    *,
    owner: Any,
    scope: ScopePath | Scope,
    messages: Any,
    source: str = "api",
    wait_seconds: float | None = None,
    llm: ChatLLM | None = None,
    embedder: Embedder | None = None,
) -> tuple[PendingUpdate, UpdateRun]:
    """The debounced queue with a window of zero, run by the caller (the direct API's
    ``infer: true``, which answers with the decisions): the messages are recorded as
    a flush of ``scope`` and the scope's run done at once, under its run lock, so this
    flush and any other pending one of the scope cost one extraction.

    Invalid messages raise ``InvalidInput`` and a missing LLM ``ProviderNotConfigured``
    (503), before anything is written. While another run of the scope holds the lock
    it waits up to ``wait_seconds`` (``INLINE_WAIT_SECONDS``), then leaves the flush
    pending and queued (status ``busy``). A provider failure leaves it pending for the
    sweep's retries (status ``failed``, the error on the flush)."""
    checked = validate_messages(messages)
    llm = llm or get_llm(feature=FEATURE)
    row = scope if isinstance(scope, Scope) else scope_ensure(owner=owner, scope=scope)
    wait = INLINE_WAIT_SECONDS if wait_seconds is None else wait_seconds
    with scope_run_lock_waiting(row.pk, wait) as taken:
        update = update_record(owner=row.owner_id, scope=row, messages=checked, source=source,
                               require_llm=False, debounce=0, arrange=not taken)  # fmt: skip
        if not taken:
            return update, UpdateRun(row.pk, "busy", [update.pk])
        rows = list(pending_of(row.pk).select_related("scope").order_by("id")[:BATCH_MAX_UPDATES])
        if update.pk not in {r.pk for r in rows}:  # more than a batch pending: ours first
            rows = [*rows[: BATCH_MAX_UPDATES - 1], update]
        result = _run(rows, timezone.now(), llm, embedder)
    try:
        update.refresh_from_db()
    except PendingUpdate.DoesNotExist:  # the scope was erased while it ran (a 500 before)
        raise ScopeNotFound("no such scope (erased meanwhile)") from None
    return update, result


# How long ``updates_run_pending`` waits for an end user's chat turns still in the task
# queue (the chat proxy hands each turn to the worker, which records it within a second).
QUEUED_TURNS_WAIT_SECONDS = 5.0


def _wait_for_queued_turns(scope: Scope, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and queued_turns(
        owner_id=scope.owner_id, external_id=str(scope.external_id)
    ):
        time.sleep(0.1)


def updates_run_pending(
    *,
    scope: Scope,
    wait_seconds: float | None = None,
    llm: ChatLLM | None = None,
    embedder: Embedder | None = None,
) -> UpdateRun:
    """Learn now what the scope's pending flushes say, as if their window had closed,
    and return when it is done (what a client that wants a fact learned before its next
    call does). An end user's chat turns the chat proxy handed to the worker a moment
    ago are waited for (up to ``QUEUED_TURNS_WAIT_SECONDS``) and learned with them.
    While another run of the scope holds it, waits up to ``wait_seconds``
    (``INLINE_WAIT_SECONDS``), then answers ``busy`` (the flushes stay pending, run on
    their schedule). A missing LLM is ``ProviderNotConfigured`` (503) before anything
    runs; statuses as ``updates_run`` (``empty``: nothing was pending)."""
    llm = llm or get_llm(feature=FEATURE)
    wait = INLINE_WAIT_SECONDS if wait_seconds is None else wait_seconds
    if scope.external_id:
        _wait_for_queued_turns(scope, QUEUED_TURNS_WAIT_SECONDS)
    with scope_run_lock_waiting(scope.pk, wait) as taken:
        if not taken:
            return UpdateRun(scope.pk, "busy")
        rows = list(pending_of(scope.pk).select_related("scope").order_by("id")[:BATCH_MAX_UPDATES])
        if not rows:
            return UpdateRun(scope.pk, "empty")
        return _run(rows, timezone.now(), llm, embedder)


def _run(rows: list[PendingUpdate], now: datetime, llm: ChatLLM | None,
         embedder: Embedder | None) -> UpdateRun:  # fmt: skip
    scope = rows[0].scope
    # In the trace of the newest flush that has one (the chat turn that asked for it),
    # linked to the others' and to the task's own.
    flushes = [r.traceparent for r in rows if r.traceparent]
    parent = flushes[-1] if flushes else ""
    links = [*flushes[:-1], traceparent()] if parent else []
    attributes = {"memory.scope": scope.label, "memory.updates": len(rows)}
    with (
        usage_for(owner_id=scope.owner_id, kind="extraction", subject=scope.label),
        span("memory.extraction", parent=parent, links=links, attributes=attributes) as s,
    ):
        result = _extract(rows, now, llm, embedder)
        annotate(s, {"memory.run.status": result.status, "memory.llm_calls": result.llm_calls,
                     "memory.facts.written": sum(d.action in ("add", "replace")
                                                 for d in result.decisions),
                     "memory.facts.removed": len(result.removed)})  # fmt: skip
        return result


def _extract(rows: list[PendingUpdate], now: datetime, llm: ChatLLM | None,
             embedder: Embedder | None) -> UpdateRun:  # fmt: skip
    scope = rows[0].scope
    batch_id = str(uuid.uuid4())
    result = UpdateRun(scope.pk, "done", [r.pk for r in rows], batch_id=batch_id)
    extracted = Extracted([], [])
    gated = settings.ENGINE_EXTRACTION_GATE and not any(learnable(r.messages) for r in rows)
    try:
        prompt = extraction_prompt(scope, rows)
        if gated:  # the idle gate: nothing to learn from, no LLM call
            reading = Reading("empty")
            counter_add("engine_updates_gated_total", len(rows))
        else:
            calls = json_calls(llm, feature=FEATURE)
            try:
                reading = calls.read(prompt.messages, shape=EXTRACTION, what="engine_extraction",
                                     source=prompt.conversation)  # fmt: skip
            finally:
                result.llm_calls = calls.count
                counter_add("engine_llm_calls_total", calls.count)
                counter_add("engine_llm_tokens_total", calls.tokens)
        if reading.status == "ok":
            extracted = parse_extraction(reading.value, prompt.known, prompt.refs, prompt.said)
        pre = PrecomputedEmbedder(embedder or get_embedder(), [f.content for f in extracted.facts])
    except ProviderError as exc:  # not configured, down, timed out: retried later
        return _failed(rows, result, exc, now)
    if reading.malformed:
        return _malformed(rows, result, reading, now)
    reason = f"debounced update {result.batch_id} ({len(rows)} flushes)"
    with transaction.atomic():
        ids = [r.pk for r in rows]
        if not _still_pending(scope, ids):  # erased while the LLM answered
            return UpdateRun(scope.pk, "empty")
        _journal(rows, result)
        source = {"kind": "flush", "ref": result.batch_id, "flushes": ids}
        result.decisions = fact_add(
            owner=scope.owner_id, scope=scope, facts=extracted.facts, reason=reason, embedder=pre,
            source=source,
        ) if extracted.facts else []  # fmt: skip
        for fact_id in extracted.removed:
            try:
                fact_delete(owner=scope.owner_id, fact_id=fact_id, reason=reason, source=source)
                result.removed.append(fact_id)
                result.removed_content[fact_id] = prompt.known[fact_id]
            except FactNotFound:  # gone meanwhile
                pass
        result.note = GATED if gated else _note(reading, extracted, result)
        PendingUpdate.objects.filter(pk__in=ids).update(
            status=PendingUpdate.Status.DONE, batch_id=result.batch_id, processed_at=now,
            attempts=F("attempts") + 1, error="", answer_excerpt="", note=result.note,
        )  # fmt: skip
        learned = sum(1 for d in result.decisions if d.action in ("add", "replace"))
        _record_run(rows, result, FormationRun.Status.DONE, now, learned)
    try:  # MEMORY.md follows the facts (the run still holds the scope's lock)
        memory_md_sync(scope)
    except Exception:  # the facts are committed: the next read or run writes it
        logger.exception("MEMORY.md of scope %s not rewritten", scope.pk)
    counter_add("engine_update_runs_total")
    counter_add("engine_updates_processed_total", len(rows))
    _log(scope, result)
    return result


# The extraction's idle gate (issue 29): a batch of flushes goes to the LLM only when a
# user message of one of them holds a word that is no acknowledgement. So a batch of
# empty messages, of assistant messages only, or of "ok", "Thanks!", "yes please", "lol",
# "👍" is done at once, its flushes noted GATED, its journal entries written as usual.
ACKNOWLEDGEMENTS = frozenset(
    "ok okay k kk thanks thank thx ty you yes yeah yep yup no nope nah sure cool great nice "
    "good fine lol haha hah hmm hm wow awesome perfect got it alright right bye hi hello hey "
    "please pls np welcome cheers so much a lot very".split()
)
GATED = "nothing to learn (idle gate: no extraction)"


def learnable(messages: list[dict[str, Any]]) -> bool:
    """Whether a flush's user messages hold a word that is no acknowledgement."""
    for message in messages:
        if message.get("role") != "user":
            continue
        words = re.findall(r"[^\W_]+", str(message.get("content") or "").casefold())
        if any(word not in ACKNOWLEDGEMENTS for word in words):
            return True
    return False


def _still_pending(scope: Scope, ids: list[int]) -> bool:
    """In the caller's transaction: hold the scope's lock against its erasure, then lock
    the batch's rows (the erasure's order: no deadlock with it); whether the scope is
    still there and every row still pending (never write twice, nor for an erased
    scope)."""
    if not scope_held_if_there(scope):
        # (the LLM call's usage, counted after the erasure, names it no more either)
        usage_subject_erase(owner_id=scope.owner_id, subject=scope.label)
        return False
    still = pending_of(scope.pk).select_for_update().filter(pk__in=ids).values_list("pk", flat=True)
    return len(list(still)) == len(ids)


def _journal(rows: list[PendingUpdate], result: UpdateRun) -> None:
    """The flushes' messages appended to the scope's journal days, in the transaction
    that found them still pending (before its commit; a re-run finds them: same hash)."""
    scope = rows[0].scope
    for row in rows:
        at = _said_at(row.messages[-1].get("at")) or row.created_at
        result.journal_entries += files.journal_append(
            owner_id=scope.owner_id, scope=scope.path, messages=row.messages, at=at,
            source=row.source,
        )  # fmt: skip


def _note(reading: Reading, extracted: Extracted, result: UpdateRun) -> str:
    """What a done run learned, for its flushes' record: "nothing to learn" for a
    well-formed empty answer, else the facts read and what became of them, the
    defaults used and the answer's variants read."""
    if reading.status == "empty":
        return NOTHING_TO_LEARN
    actions: dict[str, int] = {}
    for decision in result.decisions:
        actions[decision.action] = actions.get(decision.action, 0) + 1
    parts = [f"{len(extracted.facts)} facts read"
             + (": " + ", ".join(f"{n} {a}" for a, n in actions.items()) if actions else "")]  # fmt: skip
    if result.removed:
        parts.append(f"{len(result.removed)} removed")
    if extracted.defaulted:
        parts.append(f"no confidence on {extracted.defaulted}: "
                     f"{settings.ENGINE_MIN_CONFIDENCE:.2f} used (ENGINE_MIN_CONFIDENCE)")  # fmt: skip
    parts += reading.notes
    return "; ".join(parts)[:255]


def _record_run(rows: list[PendingUpdate], result: UpdateRun, status: str, now: datetime,
                learned: int = 0) -> None:  # fmt: skip
    scope = rows[0].scope
    FormationRun.objects.create(owner_id=scope.owner_id, scope=scope, batch_id=result.batch_id or "",
                                status=status, updates=len(rows), facts_learned=learned,
                                created_at=now)  # fmt: skip


def _malformed(rows: list[PendingUpdate], result: UpdateRun, reading: Reading,
               now: datetime) -> UpdateRun:  # fmt: skip
    """The answer could not be read, even asked again: the flushes are marked
    ``malformed`` with the reason and the start of the answer (their messages stay, and
    are in the journal), not retried; the run is counted and logged at warning."""
    ids = [r.pk for r in rows]
    result.status, result.error = "malformed", reading.reason
    with transaction.atomic():
        if not _still_pending(rows[0].scope, ids):
            return UpdateRun(rows[0].scope_id, "empty")
        _journal(rows, result)
        PendingUpdate.objects.filter(pk__in=ids).update(
            status=PendingUpdate.Status.MALFORMED, batch_id=result.batch_id, processed_at=now,
            attempts=F("attempts") + 1, error=reading.reason[:2000],
            answer_excerpt=reading.excerpt, note="",
        )  # fmt: skip
        _record_run(rows, result, FormationRun.Status.MALFORMED, now)
    counter_add("engine_update_runs_total")
    logger.warning(json.dumps({"event": "engine_update_malformed", "scope_id": result.scope_id,
                               "batch_id": result.batch_id, "updates": ids,
                               "reason": reading.reason, "answer": reading.excerpt},
                              ensure_ascii=False))  # fmt: skip
    return result


def _failed(
    rows: list[PendingUpdate], result: UpdateRun, exc: Exception, now: datetime
) -> UpdateRun:
    """Keep the flushes for a later run (the sweep), backing off; give up on a flush
    after its attempts, keeping it (and what it said) as failed.

    Each flush counts its own attempts: its first, and each retry made once its back-off
    has passed. A run a client asks for meanwhile (``infer: true``, ``updates/run``), or
    a new flush's run, that fails again is not one of them: five such calls in a second of an outage gave
    up on the flushes at once, a new flush among them included (it took the batch's
    count)."""
    counted = {r.pk: r.attempts + (1 if r.attempts == 0 or r.due_at <= now else 0)
               for r in rows}  # fmt: skip
    result.error = str(exc)
    error = str(exc)[:2000]
    limit = settings.MEMORY_UPDATE_MAX_ATTEMPTS
    kept = {pk: n for pk, n in counted.items() if n < limit}
    with transaction.atomic():
        if not _still_pending(rows[0].scope, [r.pk for r in rows]):
            return UpdateRun(rows[0].scope_id, "empty")  # erased meanwhile: no retry, no record
        for attempts in set(counted.values()):
            ids = [pk for pk, n in counted.items() if n == attempts]
            if attempts >= limit:
                PendingUpdate.objects.filter(pk__in=ids).update(
                    status=PendingUpdate.Status.FAILED, attempts=attempts, error=error,
                    processed_at=now,
                )  # fmt: skip
        if kept:
            # (one retry time for the scope's batch, backing off as its most tried flush)
            retry_at = now + timedelta(seconds=min(3600, 60 * 2 ** (max(kept.values()) - 1)))
            for attempts in set(kept.values()):
                ids = [pk for pk, n in kept.items() if n == attempts]
                PendingUpdate.objects.filter(pk__in=ids).update(
                    attempts=attempts, error=error, due_at=retry_at
                )
            schedule_run(rows[0].scope_id, retry_at, owner_id=rows[0].owner_id)
            result.status = "failed"
        else:
            result.status = "gave_up"
        _record_run(rows, result, FormationRun.Status.FAILED, now)
    logger.warning(json.dumps({"event": "engine_update_failed", "scope_id": result.scope_id,
                               "attempts": max(counted.values()), "error": result.error}))  # fmt: skip
    return result


def _log(scope: Scope, result: UpdateRun) -> None:
    logger.info(json.dumps({
        "event": "engine_update", "scope": scope.path, "owner_id": scope.owner_id,
        "batch_id": result.batch_id, "updates": result.updates, "llm_calls": result.llm_calls,
        "decisions": [{"action": d.action, "content": d.content, "fact_id": d.fact_id}
                      for d in result.decisions],
        "removed": result.removed,
    }, ensure_ascii=False))  # fmt: skip


def updates_sweep(*, now: datetime | None = None) -> int:
    """Queue a run for every scope whose pending flushes are due (a run lost with a
    killed worker, a schedule lost, a retry after a failure); forget processed flushes
    and run records older than ``MEMORY_UPDATE_KEEP_DAYS`` (their journal entries
    stay). Returns the runs queued."""
    from core.queue import enqueue

    now = now or timezone.now()
    kept_since = now - timedelta(days=settings.MEMORY_UPDATE_KEEP_DAYS)
    PendingUpdate.objects.exclude(status=PendingUpdate.Status.PENDING).filter(
        processed_at__lt=kept_since
    ).delete()
    FormationRun.objects.filter(created_at__lt=kept_since).delete()
    scopes = due_scopes_of_owners(now=now)
    for scope_id, owner_id in scopes:
        enqueue("ingestion.tasks.engine_updates_run", scope_id,
                task_name=f"engine-updates-{scope_id}", owner_id=owner_id)  # fmt: skip
    return len(scopes)


def _said_at(value: object) -> datetime | None:
    """A stored message's ``at``, or None when it has none or it does not read as a time
    (a flush stored before its ``at`` was checked, 2026-11-28: "2026-02-30T10:00:00"
    once failed its scope's every run)."""
    if not isinstance(value, str):
        return None
    try:
        return _storable(parse_datetime(value))
    except ValueError:
        return None
