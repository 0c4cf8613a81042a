"""Deep Dream: consolidate a scope's core facts with what its journal says, reversibly.

A dream reads the scope's ``MEMORY.md`` (its facts rendered as Markdown, fresh from
the database) and the last ``lookback_days`` journal days, asks the LLM to merge,
refine, drop what is redundant and let the newer win, and applies the answer through
the core-fact services (each change audited with the dream as its reason). It then
rewrites ``MEMORY.md`` and writes the dream diary ``dreams/.../YYYY-MM-DD.md``.

Beating CowAgent's dream (#2931): every dream keeps in the database the facts and the
``MEMORY.md`` it started from and each change it made, and ``dream_undo`` puts them
back; the daily schedule can be switched off per owner (``EngineSettings``); a dream
that would drop more than ``ENGINE_DREAM_MAX_DROP`` of the facts is refused before it
changes anything; unchanged inputs (same hash) skip the LLM call.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.errors import Conflict, InvalidInput, NotFound, ServiceError, Unprocessable
from core.key_limits import scope_check
from core.metrics import counter_add
from core.providers.embeddings import Embedder, get_embedder
from core.providers.errors import ProviderBadResponse
from core.providers.json_answer import Field, ListSpec, MalformedAnswer, Shape
from core.providers.llm import ChatLLM
from core.queue import enqueue
from core.usage import budget_spent, usage_for, usage_subject_erase
from memories.engine import files
from memories.engine.llm import (
    CATEGORY,
    CONFIDENCE,
    CONTENT,
    FACT_PLACEHOLDERS,
    JsonCalls,
    PrecomputedEmbedder,
    json_calls,
)
from memories.engine.locks import ScopeBusy, scope_run_lock, scope_run_lock_waiting
from memories.engine.models import Dream, EngineSettings, PendingUpdate
from memories.engine.owner_settings import dream_schedule_enabled
from memories.facts.models import CATEGORIES, FactChange, Scope
from memories.facts.scopes import ScopePath, owner_pk, scope_find, scope_parse
from memories.facts.selectors import FactNotFound, ScopeNotFound, facts_snapshot
from memories.facts.services import (
    MAX_FACT_CHARS,
    FactIn,
    fact_add,
    fact_delete,
    fact_restore,
    fact_update,
    normalize_fact,
    scope_held_if_there,
    version_vector,
)

logger = logging.getLogger("memories.decisions")
FEATURE = "Deep Dream (POST /api/v1/engine/dream)"
MAX_LOOKBACK_DAYS = 90
DREAM_TASK = "ingestion.tasks.engine_dream_scope"
SCHEDULED_WAIT_SECONDS = 120.0  # a scheduled dream waits this long for a run of its scope
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# The audit reasons of a dream's own changes and of their undo (``dream <id>``).
OWN_REASONS = r"^(undo of )?dream [0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

DREAM_PROMPT = """You consolidate the long-term memory of one scope ({scope}): a "deep dream".

MEMORY.md, the current facts (each line ends with its id):
{memory_md}

Journal of the last {days} days, oldest first:
{journal}

Rewrite the list of facts:
1. Merge duplicates and near-duplicates into one fact.
2. Refine vague facts with what the journal says.
3. Drop what is redundant or no longer true.
4. When two facts (or a fact and the journal) disagree, the newer wins.
5. Keep every fact that is still useful. Keep its id when you keep or refine it; a merged fact keeps the id of one of the facts it merges. A fact learned from the journal has "id": null and "day": the journal day it comes from (YYYY-MM-DD).
6. category is one of: preference, knowledge, context, behavior, goal, correction; confidence is from 0 to 1.

Answer with the JSON object only:
{{"facts": [{{"id": "<id or null>", "content": "...", "category": "preference", "confidence": 0.9, "day": null}}], "diary": "a short Markdown account of what you changed and why"}}"""


# The dream answer: the documented shape, and the variants models write.
DREAM = Shape(
    "memory_dream",
    (
        ListSpec(
            "facts",
            ("memories", "newFacts", "new_facts", "facts_list", "items", "results", "entries"),
            (Field("id", "ref", ("fact_id", "memory_id")), CONTENT, CATEGORY, CONFIDENCE,
             Field("day", "ref", ("date", "journal_day", "source_day"))),
        ),
    ),
    texts=(Field("diary", aliases=("account", "summary", "notes", "changes_summary")),),
    example='{"facts": [{"id": "<id or null>", "content": "...", "category": "preference", '
    '"confidence": 0.9, "day": null}], "diary": "..."}',
    placeholders=FACT_PLACEHOLDERS,
)  # fmt: skip


class DreamNotFound(NotFound):
    code = "dream_not_found"


class DreamTooLossy(Unprocessable):
    code = "dream_too_lossy"


class DreamNotUndoable(Conflict):
    code = "dream_not_undoable"


@dataclass
class DreamOutcome:
    dream: Dream
    skipped: bool = False  # same inputs as the last dream: no LLM call, nothing changed


# --- MEMORY.md ----------------------------------------------------------------------
def render_memory_md(scope: Scope, facts: list[dict[str, Any]]) -> str:
    """The scope's facts as Markdown, by category, highest confidence first, then the
    most recently said. No clock in it, and nothing an undo does not put back (not the
    update time): the same facts render the same text (and hash)."""
    lines = [f"# MEMORY · {'/'.join(scope.path)}", "", f"{len(facts)} facts.", ""]
    facts = sorted(facts, key=lambda f: f["id"])
    facts.sort(key=lambda f: f["observed_at"], reverse=True)
    facts.sort(key=lambda f: f["confidence"], reverse=True)
    for category in CATEGORIES:
        group = [f for f in facts if f["category"] == category]
        if not group:
            continue
        lines += [f"## {category}", ""]
        lines += [f"- [{f['confidence']:.2f}] {f['content']} (id: {f['id']})" for f in group]
        lines.append("")
    return "\n".join(lines)


def memory_md_sync(scope: Scope) -> str:
    """Bring the scope's stored files up to date, for a caller holding the scope's run
    lock: the diary entries of dreams (and undos) a crash left unwritten, then
    ``MEMORY.md`` rendered from the facts, rewritten when it differs. Returns the text.
    A scope erased meanwhile gets no file (the erasure does not wait for the run lock,
    so they are written under the lock it takes: an erasure after them deletes them)."""
    with transaction.atomic():
        if not scope_held_if_there(scope):
            return render_memory_md(scope, [])
        dream_files_recover(scope)
        text = render_memory_md(scope, facts_snapshot(scope=scope))
        name = files.memory_md_path(scope.owner_id, scope.path)
        if files.read_text(name) != text:
            files.write_text(name, text)
    return text


def memory_md_read(scope: Scope) -> str:
    """The scope's ``MEMORY.md`` as it is now: rendered from its facts on every read.
    The stored file is brought up to date too (``memory_md_sync``) unless a run of the
    scope holds its lock (that run writes it)."""
    with scope_run_lock(scope.pk) as taken:
        if taken:
            return memory_md_sync(scope)
    return render_memory_md(scope, facts_snapshot(scope=scope))


# --- reading ------------------------------------------------------------------------
def _journal(scope: Scope, today: date, lookback: int) -> tuple[list[str], str]:
    days, parts = [], []
    for back in range(lookback - 1, -1, -1):
        day = today - timedelta(days=back)
        text = files.read_text(files.journal_path(scope.owner_id, scope.path, day))
        if text is not None:
            days.append(day.isoformat())
            parts.append(text)
    return days, "\n".join(parts)


def _hash(memory_md: str, journal: str, lookback: int) -> str:
    return hashlib.sha256(f"{lookback}\0{memory_md}\0{journal}".encode()).hexdigest()


def _lookback(value: Any) -> int:
    lookback = settings.ENGINE_DREAM_LOOKBACK_DAYS if value is None else value
    if (
        not isinstance(lookback, int)
        or isinstance(lookback, bool)
        or not 1 <= lookback <= MAX_LOOKBACK_DAYS
    ):
        raise InvalidInput(f"lookback_days must be a whole number from 1 to {MAX_LOOKBACK_DAYS}",
                           details={"lookback_days": value})  # fmt: skip
    return lookback


def _scope_row(owner: AbstractBaseUser | int, scope: ScopePath | Scope) -> Scope:
    if isinstance(scope, Scope):
        return scope
    row = scope_find(owner=owner, scope=scope_parse(list(scope)))
    if row is None:
        raise ScopeNotFound("no such scope")
    return row


def latest_dream(scope: Scope) -> Dream | None:
    return (
        Dream.objects.filter(scope=scope, status=Dream.Status.APPLIED)
        .order_by("-created_at")
        .first()
    )


@dataclass
class DreamInputs:
    """What a dream of the scope would read now."""

    facts: list[dict[str, Any]]
    memory_md: str
    days: list[str]
    journal: str
    input_hash: str
    unchanged_since: Dream | None  # the last dream, when these inputs are the same as its


def dream_inputs(scope: Scope, *, lookback: int, today: date) -> DreamInputs:
    facts = facts_snapshot(scope=scope)
    memory_md = render_memory_md(scope, facts)
    days, journal = _journal(scope, today, lookback)
    input_hash = _hash(memory_md, journal, lookback)
    last = latest_dream(scope)
    same = last is not None and input_hash in (last.input_hash, last.result_hash)
    return DreamInputs(facts, memory_md, days, journal, input_hash, last if same else None)


def dream_messages(scope: Scope, inputs: DreamInputs, lookback: int) -> list[dict[str, str]]:
    """The dream asked of the LLM: the scope's MEMORY.md and journal in ``DREAM_PROMPT``."""
    prompt = DREAM_PROMPT.format(scope="/".join(scope.path), memory_md=inputs.memory_md,
                                 days=lookback, journal=inputs.journal or "(no entries)")  # fmt: skip
    return [{"role": "system", "content": prompt}]


def dream_preview(
    *,
    owner: AbstractBaseUser | int,
    scope: ScopePath | Scope,
    lookback_days: int | None = None,
    today: date | None = None,
) -> DreamInputs:
    """What ``dream_run`` would read (and whether it would skip), changing nothing."""
    return dream_inputs(_scope_row(owner, scope), lookback=_lookback(lookback_days),
                        today=today or timezone.now().date())  # fmt: skip


# --- the plan -----------------------------------------------------------------------
def _source_day(item: dict[str, Any], days: list[str]) -> str | None:
    """The journal day a new fact comes from: the day the answer names when the dream
    read it, else the newest day it read; None when it read no journal."""
    named = str(item.get("day") or "")
    return named if named in days else (days[-1] if days else None)


def _plan(
    before: list[dict[str, Any]], parsed: dict[str, Any] | None, days: list[str] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """What the answer (``DREAM``'s value, read) changes: [{action, ...}] with
    ``update`` (category or confidence), ``replace`` (new text), ``add`` and ``delete``;
    and the diary text.

    A new fact without a confidence gets ``ENGINE_MIN_CONFIDENCE`` (kept, but the first
    to go when ``max_facts`` trims the scope), and its source is the journal day it
    came from (``days``: the days read, oldest first)."""
    raw = (parsed or {}).get("facts")
    if not isinstance(raw, list):
        raise ProviderBadResponse("the dream answer has no list of facts")
    by_id = {f["id"]: f for f in before}
    by_text = {normalize_fact(f["content"]): f for f in before}
    kept: set[str] = set()
    plan: list[dict[str, Any]] = []
    for item in raw:
        content = item["content"][:MAX_FACT_CHARS]
        category = item.get("category")
        confidence = item.get("confidence")
        # a fact given back without its id but with its text is that fact, kept
        old = by_id.get(str(item.get("id") or "")) or by_text.get(normalize_fact(content))
        if old is None or old["id"] in kept:  # new (or a second use of one id): an addition
            missing = settings.ENGINE_MIN_CONFIDENCE
            plan.append({"action": "add", "content": content, "category": category or "context",
                         "confidence": missing if confidence is None else confidence,
                         "day": _source_day(item, days or [])})  # fmt: skip
            continue
        kept.add(old["id"])
        after = {"category": category or old["category"],
                 "confidence": old["confidence"] if confidence is None else confidence}  # fmt: skip
        if content != old["content"]:
            plan.append({"action": "replace", "fact_id": old["id"], "before": old,
                         "content": content, **after})  # fmt: skip
        elif after != {"category": old["category"], "confidence": old["confidence"]}:
            plan.append({"action": "update", "fact_id": old["id"], "before": old, "after": after})
    plan += [
        {"action": "delete", "fact_id": f["id"], "before": f} for f in before if f["id"] not in kept
    ]
    diary = (parsed or {}).get("diary")
    return plan, diary.strip() if isinstance(diary, str) else ""


def _check_loss(before: list[dict[str, Any]], plan: list[dict[str, Any]]) -> None:
    dropped = sum(1 for change in plan if change["action"] == "delete")
    limit = settings.ENGINE_DREAM_MAX_DROP
    if before and dropped > limit * len(before):
        raise DreamTooLossy(
            f"the dream would drop {dropped} of {len(before)} facts (more than "
            f"ENGINE_DREAM_MAX_DROP={limit}); nothing was changed",
            details={"dropped": dropped, "facts": len(before), "max_drop": limit},
        )


def _apply(
    scope: Scope, dream: Dream, plan: list[dict[str, Any]], embedder: Embedder
) -> list[dict[str, Any]]:
    reason = f"dream {dream.pk}"
    source = {"kind": "dream", "ref": str(dream.pk)}
    by_id = {f["id"]: f for f in dream.facts_before}
    applied: list[dict[str, Any]] = []
    for change in plan:
        action = change["action"]
        if action == "update":
            fact_update(owner=scope.owner_id, fact_id=change["fact_id"], scope=scope,
                             reason=reason, source=source, **change["after"])  # fmt: skip
            applied.append(change)
        elif action == "delete":
            fact_delete(owner=scope.owner_id, fact_id=change["fact_id"], scope=scope,
                             reason=reason, source=source)  # fmt: skip
            applied.append(change)
        else:  # add or replace: thresholded like every new fact
            day = change.get("day")
            fact = FactIn(content=change["content"], category=change["category"],
                          confidence=change["confidence"], source_kind="journal" if day else "dream",
                          source_ref=day or str(dream.pk), replaces=change.get("fact_id"))  # fmt: skip
            [decision] = fact_add(owner=scope.owner_id, scope=scope, facts=[fact], reason=reason,
                                       embedder=embedder, source=source)  # fmt: skip
            applied.append({**change, "result": decision.action, "new_id": decision.fact_id})
            # max_facts trimmed the scope: those facts come back on undo too
            applied += [{"action": "delete", "fact_id": gone, "before": by_id[gone], "evicted": True}
                        for gone in decision.evicted_ids if gone in by_id]  # fmt: skip
    return applied


def dream_run(
    *,
    owner: AbstractBaseUser | int,
    scope: ScopePath | Scope,
    lookback_days: int | None = None,
    trigger: str = Dream.Trigger.API,
    today: date | None = None,
    llm: ChatLLM | None = None,
    embedder: Embedder | None = None,
    wait_seconds: float = 0,
) -> DreamOutcome:
    """Dream one scope now (see the module docstring); returns the dream, or the last
    one with ``skipped`` when the inputs are unchanged (no LLM call).

    Raises ``ProviderNotConfigured`` (503, names ``LLM_BASE_URL``) without an LLM,
    ``ScopeNotFound`` for a scope the owner does not have (or erased while the LLM
    answered: nothing is written for it, files included), ``ScopeBusy`` (409) while an
    update or another dream of the scope runs, ``DreamTooLossy`` (422) and provider
    errors; in each case nothing changes. ``wait_seconds``: how long to wait for a run
    of the scope holding its lock before ``ScopeBusy``.
    """
    lookback = _lookback(lookback_days)
    calls = json_calls(llm, feature=FEATURE)
    row = _scope_row(owner, scope)
    try:
        with usage_for(owner_id=row.owner_id, kind="dream", subject=row.label):
            return _dream(row, lookback, trigger, today, calls, embedder, wait_seconds)
    except ScopeNotFound:  # erased meanwhile: its LLM call's usage names it no more
        usage_subject_erase(owner_id=row.owner_id, subject=row.label)
        raise


def _dream(row: Scope, lookback: int, trigger: str, today: date | None, calls: JsonCalls,
           embedder: Embedder | None, wait_seconds: float) -> DreamOutcome:  # fmt: skip
    today = today or timezone.now().date()
    with scope_run_lock_waiting(row.pk, wait_seconds) as taken:
        if not taken:
            raise ScopeBusy("this scope's memory is being updated; try again shortly")
        with transaction.atomic():  # a dream a crash left without its files (not if erased)
            if scope_held_if_there(row):
                dream_files_recover(row)
        inputs = dream_inputs(row, lookback=lookback, today=today)
        before, memory_md, days, journal, input_hash = (
            inputs.facts,
            inputs.memory_md,
            inputs.days,
            inputs.journal,
            inputs.input_hash,
        )
        if inputs.unchanged_since is not None:
            return DreamOutcome(inputs.unchanged_since, skipped=True)
        try:
            reading = calls.read(dream_messages(row, inputs, lookback), shape=DREAM,
                                 what="dream", source=f"{memory_md}\n{journal}")  # fmt: skip
        finally:
            counter_add("engine_llm_calls_total", calls.count)
        if reading.malformed:  # nothing changes: a 502 with the reason and the answer
            raise MalformedAnswer("dream", reading.reason, reading.answer)
        plan, diary = _plan(before, reading.value, days)
        _check_loss(before, plan)
        pre = PrecomputedEmbedder(embedder or get_embedder(),
                                  [c["content"] for c in plan if "content" in c])  # fmt: skip
        with transaction.atomic():
            if not scope_held_if_there(row):  # erased while the LLM answered
                raise ScopeNotFound("no such scope (erased meanwhile)")
            dream = Dream.objects.create(
                owner_id=row.owner_id, scope=row, trigger=trigger, lookback_days=lookback,
                journal_days=days, input_hash=input_hash, facts_before=before,
                memory_md_before=memory_md, llm_calls=calls.count,
            )  # fmt: skip
            dream.changes = _apply(row, dream, plan, pre)
            dream.memory_md_after = render_memory_md(row, facts_snapshot(scope=row))
            dream.result_hash = _hash(dream.memory_md_after, journal, lookback)
            dream.diary = _diary(row, dream, diary)
            dream.save(update_fields=["changes", "memory_md_after", "result_hash", "diary"])
        with transaction.atomic():  # (an erasure since the commit deletes them: no files)
            if scope_held_if_there(row):
                _write_files(row, dream, dream.memory_md_after)
    counter_add("engine_dreams_total")
    logger.info(json.dumps({"event": "engine_dream", "dream_id": str(dream.pk), "scope": row.path,
                            "changes": [c["action"] for c in dream.changes]}))  # fmt: skip
    return DreamOutcome(dream)


def _diary(scope: Scope, dream: Dream, account: str) -> str:
    counts: dict[str, int] = {}
    for change in dream.changes:
        counts[change["action"]] = counts.get(change["action"], 0) + 1
    summary = ", ".join(f"{n} {a}" for a, n in sorted(counts.items())) or "no change"
    at = dream.created_at.strftime("%H:%M:%S")
    facts, days = len(dream.facts_before), len(dream.journal_days)
    return (f"## Dream {dream.pk} · {at} UTC\n\n"
            f"Read {_count(facts, 'fact')} and {_count(days, 'journal day')}; "
            f"{summary}.\n\n{account or '(no account given)'}\n")  # fmt: skip


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _write_files(scope: Scope, dream: Dream, memory_md: str) -> None:
    """After the commit: ``MEMORY.md`` replaced, the diary entries appended, and the
    dream marked as having its files. A process that dies before the mark leaves
    ``files_written`` false: the next run or read of the scope writes them
    (``dream_files_recover``)."""
    files.write_text(files.memory_md_path(scope.owner_id, scope.path), memory_md)
    _diary_entries(scope, dream)
    Dream.objects.filter(pk=dream.pk).update(files_written=True)
    dream.files_written = True


def _diary_append(scope: Scope, day: date, mark: str, entry: str) -> None:
    """Append ``entry`` to the day's diary unless ``mark`` is already in it (each dream,
    and each undo, is written once)."""
    name = files.diary_path(scope.owner_id, scope.path, day)
    current = (
        files.read_text(name) or f"# Dream diary · {'/'.join(scope.path)} · {day.isoformat()}\n\n"
    )
    if mark not in current:
        files.write_text(name, current + entry + "\n")


def _diary_entries(scope: Scope, dream: Dream) -> None:
    _diary_append(scope, dream.created_at.date(), f"## Dream {dream.pk} ", dream.diary)
    if dream.status == Dream.Status.UNDONE and dream.undone_at is not None:
        _diary_append(scope, dream.undone_at.date(), f"## Undo of dream {dream.pk} ",
                      _undo_entry(dream))  # fmt: skip


def _undo_entry(dream: Dream) -> str:
    changes = dream.changes
    back = sum(1 for c in changes if c["action"] in ("replace", "delete"))
    removed = sum(
        1
        for c in changes
        if c["action"] == "add" and c.get("result") in ("add", "replace", "evicted")
    )
    changed = sum(1 for c in changes if c["action"] == "update")
    at = dream.undone_at.strftime("%H:%M:%S") if dream.undone_at else "?"
    return (f"## Undo of dream {dream.pk} · {at} UTC\n\n"
            f"{back} facts put back as they were, {removed} removed, {changed} changed back; "
            f"MEMORY.md as it was before the dream (of "
            f"{dream.created_at:%Y-%m-%d %H:%M:%S} UTC).\n")  # fmt: skip


def dream_files_recover(scope: Scope) -> int:
    """Write the files of the scope's dreams (and undos) whose process died between
    their commit and their files: their diary entries, then ``MEMORY.md`` rendered
    from the facts as they are now. For a caller holding the scope's run lock.
    Returns the dreams caught up."""
    pending = list(Dream.objects.filter(scope=scope, files_written=False).order_by("created_at"))
    for dream in pending:
        _diary_entries(scope, dream)
    if pending:
        text = render_memory_md(scope, facts_snapshot(scope=scope))
        files.write_text(files.memory_md_path(scope.owner_id, scope.path), text)
        Dream.objects.filter(pk__in=[d.pk for d in pending]).update(files_written=True)
    return len(pending)


# --- undo ---------------------------------------------------------------------------
def dream_get(*, owner: AbstractBaseUser | int, dream_id: Any) -> Dream:
    try:
        dream = Dream.objects.select_related("scope").get(owner_id=owner_pk(owner), pk=dream_id)
    except (Dream.DoesNotExist, ValidationError, ValueError, TypeError):  # malformed ids too
        raise DreamNotFound("no such dream") from None
    scope_check(dream.scope.path, named=False)
    return dream


def dream_list(*, owner: AbstractBaseUser | int, scope: Scope) -> Any:
    return Dream.objects.filter(owner_id=owner_pk(owner), scope=scope).order_by("-created_at")


def dream_undo(
    *, owner: AbstractBaseUser | int, dream_id: Any, embedder: Embedder | None = None
) -> Dream:
    """Put the scope's facts and ``MEMORY.md`` back as they were before the dream.

    Only the scope's latest applied dream can be undone (undo the later ones first):
    its own changes are reverted (facts it dropped or rewrote come back with their
    ids and values, facts it added go), so facts learned after it stay. Raises
    ``DreamNotFound`` (404, another owner's too), ``DreamNotUndoable`` (409) or
    ``ScopeBusy`` (409); nothing changes then.
    """
    dream = dream_get(owner=owner, dream_id=dream_id)
    scope = dream.scope
    with scope_run_lock(scope.pk) as taken:
        if not taken:
            raise ScopeBusy("this scope's memory is being updated; try again shortly")
        dream.refresh_from_db()
        latest = latest_dream(scope)
        if dream.status != Dream.Status.APPLIED or latest is None or latest.pk != dream.pk:
            raise DreamNotUndoable(
                "only the scope's latest dream that is not undone can be undone",
                details={
                    "status": dream.status,
                    "latest_dream": str(latest.pk) if latest else None,
                },
            )
        # Facts it dropped or rewrote come back through their closed versions (their
        # vectors kept); only a fact with no version of that text is embedded again.
        back = [c["before"] for c in dream.changes if c["action"] in ("replace", "delete")]
        back = [f for f in back if version_vector(scope=scope, fact_id=f["id"],
                                                  content=f["content"]) is None]  # fmt: skip
        embedder = embedder or get_embedder()
        vectors: Any = embedder.embed([f["content"] for f in back]) if back else []
        embedding_of = {f["id"]: [float(x) for x in v] for f, v in zip(back, vectors, strict=True)}
        reason = f"undo of dream {dream.pk}"
        dream_files_recover(scope)
        with transaction.atomic():
            for change in reversed(dream.changes):
                _revert(
                    scope,
                    change,
                    embedding_of,
                    embedder,
                    reason,
                    {"kind": "dream_undo", "ref": str(dream.pk)},
                )
            dream.status, dream.undone_at = Dream.Status.UNDONE, timezone.now()
            dream.files_written = False
            dream.save(update_fields=["status", "undone_at", "files_written"])
        _write_files(scope, dream, dream.memory_md_before)  # what was saved, as it was
    counter_add("engine_dream_undos_total")
    return dream


def _revert(scope: Scope, change: dict[str, Any], embedding_of: dict[str, list[float]],
            embedder: Embedder, reason: str, source: dict[str, str]) -> None:  # fmt: skip
    action = change["action"]
    if action in ("add", "replace") and change.get("result") in ("add", "replace", "evicted"):
        try:
            fact_delete(owner=scope.owner_id, fact_id=change["new_id"], scope=scope,
                             reason=reason, source=source)  # fmt: skip
        except FactNotFound:  # deleted since
            pass
    if action in ("replace", "delete"):
        before = change["before"]
        fact_restore(scope=scope, fact=before, embedding=embedding_of.get(before["id"]),
                          embedder=embedder, reason=reason)  # fmt: skip
    elif action == "update":
        before = change["before"]
        try:
            fact_update(owner=scope.owner_id, fact_id=change["fact_id"], scope=scope,
                             category=before["category"], confidence=before["confidence"],
                             reason=reason, source=source)  # fmt: skip
        except FactNotFound:
            pass


# --- the schedule -------------------------------------------------------------------
def dream_candidates(*, now: datetime | None = None) -> list[tuple[int, int]]:
    """(owner id, scope id) of every scope (not an owner's global memories) with at least
    ``ENGINE_DREAM_MIN_CHANGES`` changes of its facts and journal since its last dream
    (ever, for a scope never dreamed), of owners with the daily dream on: the idle gate,
    a scope that learned one thing since is left for a later day. A fact change is any
    audit row but a dream's own changes and their undo (a REST write, an update run, an
    eviction...); a journal change is a flush processed since."""
    now = now or timezone.now()
    last = Dream.objects.filter(scope=OuterRef("pk")).order_by("-created_at").values("created_at")
    changed = (
        FactChange.objects.filter(scope=OuterRef("pk"), created_at__gt=OuterRef("since"),
                                    created_at__lte=now)
        .exclude(reason__regex=OWN_REASONS)
    )  # fmt: skip
    journal = PendingUpdate.objects.filter(
        scope=OuterRef("pk"), status=PendingUpdate.Status.DONE,
        processed_at__gt=OuterRef("since"), processed_at__lte=now,
    )  # fmt: skip

    def count(rows: Any) -> Any:
        return Coalesce(Subquery(rows.order_by().values("scope").annotate(n=Count("pk"))
                                 .values("n")[:1]), 0)  # fmt: skip

    rows = (
        Scope.objects.exclude(path=[])  # (global memories are not consolidated)
        .annotate(since=Coalesce(Subquery(last[:1]), Value(EPOCH)))
        .filter(Exists(changed) | Exists(journal))
        .annotate(material=count(changed) + count(journal))
        .filter(material__gte=settings.ENGINE_DREAM_MIN_CHANGES)
        .order_by("pk")
        .values_list("owner_id", "pk")
    )
    switches = dict(EngineSettings.objects.values_list("owner_id", "dream_schedule"))
    default = EngineSettings().dream_schedule  # an owner without a row
    return [(owner, scope) for owner, scope in rows if switches.get(owner, default)]


def dreams_daily(*, now: datetime | None = None) -> int:
    """The daily schedule: one task (``ingestion.tasks.engine_dream_scope``) per scope
    ``dream_candidates`` names, so each scope's dream has the task timeout to itself
    and a slow or failing scope holds up no other. Returns the tasks queued."""
    now = now or timezone.now()
    candidates = dream_candidates(now=now)
    for owner_id, scope_id in candidates:
        enqueue(DREAM_TASK, scope_id, now.date().isoformat(),
                task_name=f"engine-dream-{scope_id}", owner_id=owner_id)  # fmt: skip
    return len(candidates)


def dream_scheduled(*, scope_id: int, day: date) -> str:
    """One scope's scheduled dream (the task). Safe to run twice: unchanged inputs skip
    the LLM (``skipped``). Two dreams of one scope never run at once: it waits up to
    ``SCHEDULED_WAIT_SECONDS`` for a run of the scope to end (``busy`` after that; the
    next day's schedule finds the scope still changed). ``deferred`` when the owner's
    token budget for the day is spent (``core.usage``: the next day's schedule finds the
    scope still changed). ``off`` when the owner turned
    the schedule off since, ``gone`` for an erased scope, ``failed`` (logged) when the
    dream is refused or the LLM fails; ``dreamed`` otherwise."""
    row = Scope.objects.filter(pk=scope_id).first()
    if row is None:
        return "gone"
    if not dream_schedule_enabled(owner=row.owner_id):
        return "off"
    if budget_spent(row.owner_id, "dream", what=f"scope {scope_id}") is not None:
        return "deferred"  # (the next day's schedule finds the scope still changed)
    try:
        outcome = dream_run(owner=row.owner_id, scope=row, trigger=Dream.Trigger.SCHEDULE,
                            today=day, wait_seconds=SCHEDULED_WAIT_SECONDS)  # fmt: skip
    except ScopeBusy:
        return "busy"
    except ScopeNotFound:  # erased while it dreamt
        return "gone"
    except ServiceError:
        logger.exception("scheduled dream of scope %s failed", scope_id)
        return "failed"
    return "skipped" if outcome.skipped else "dreamed"
