"""What LLM and embedding calls cost, per owner, day, kind of work, model and end user.

The work that makes calls says whose they are and what for (``usage_for``: a context
manager setting a context variable, so the calls deep inside need no new argument);
the provider layer records each call's tokens from the provider's ``usage``
(``usage_record``), or counted with the tokenizer when the provider sends none (marked
estimated). One statement raises the owner's day row (``UsageDay``) and the all-owners
total (``UsageTotal``, what /metrics exports by kind and model). A call outside any
``usage_for`` is counted in the total as kind ``other``, with no owner.

Local embedders (the bundled MiniLM, ``hashing``) cost no provider tokens and are not
recorded: a search would otherwise write a row on every query.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import F, Sum
from django.utils import timezone

from core.context import context_set
from core.metrics import counter_add
from core.providers.tokens import count_tokens
from core.tracing import note_usage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attribution:
    owner_id: int | None
    kind: str
    subject: str = ""


_current: ContextVar[Attribution | None] = ContextVar("usage_attribution", default=None)


def usage_for(
    *, owner_id: int | None, kind: str, subject: str = ""
) -> AbstractContextManager[None]:
    """Calls made inside are ``owner_id``'s, for ``kind`` of work, about ``subject``."""
    return context_set(_current, Attribution(owner_id, kind, subject))


def usage_as(who: Attribution | None) -> AbstractContextManager[None]:
    """The calls inside are ``who``'s (as ``usage_for``; None changes nothing)."""
    return context_set(_current, who)


def usage_kind(kind: str) -> AbstractContextManager[None]:
    """The calls inside are of ``kind``, for the owner and subject already attributed."""
    return context_set(_current, replace(_current.get() or Attribution(None, kind), kind=kind))


def attribution() -> Attribution | None:
    return _current.get()


_RECORD_SQL = """
WITH total AS (
    INSERT INTO core_usagetotal AS u (kind, model, calls, tokens_in, tokens_out, estimated_calls)
    VALUES (%(kind)s, %(model)s, 1, %(tin)s, %(tout)s, %(est)s)
    ON CONFLICT (kind, model) DO UPDATE SET calls = u.calls + 1,
        tokens_in = u.tokens_in + excluded.tokens_in,
        tokens_out = u.tokens_out + excluded.tokens_out,
        estimated_calls = u.estimated_calls + excluded.estimated_calls
    RETURNING 1
)
INSERT INTO core_usageday AS u (owner_id, day, kind, model, subject, calls, tokens_in,
                                tokens_out, estimated_calls)
SELECT %(owner)s, %(day)s, %(kind)s, %(model)s, %(subject)s, 1, %(tin)s, %(tout)s, %(est)s
FROM total WHERE %(owner)s::int IS NOT NULL
ON CONFLICT (owner_id, day, kind, model, subject) DO UPDATE SET calls = u.calls + 1,
    tokens_in = u.tokens_in + excluded.tokens_in,
    tokens_out = u.tokens_out + excluded.tokens_out,
    estimated_calls = u.estimated_calls + excluded.estimated_calls
"""


_ASYNC_SQL = _RECORD_SQL.replace(
    "WITH total AS (",
    "WITH quick AS (SELECT set_config('synchronous_commit', 'off', true)),\ntotal AS (",
).replace("FROM total WHERE", "FROM total, quick WHERE")


# Erasure: the scope's rows merged into the owner's rows of the same day, kind and model
# with the anonymous subject (their counts added), in one statement; in key order, so two
# erasures of one owner lock the shared rows in the same order (no deadlock).
_ERASE_SQL = """
WITH gone AS (
    DELETE FROM core_usageday WHERE owner_id = %(owner)s AND subject = %(subject)s
    RETURNING day, kind, model, calls, tokens_in, tokens_out, estimated_calls
)
INSERT INTO core_usageday AS u (owner_id, day, kind, model, subject, calls, tokens_in,
                                tokens_out, estimated_calls)
SELECT %(owner)s, day, kind, model, %(erased)s, calls, tokens_in, tokens_out, estimated_calls
FROM gone ORDER BY day, kind, model
ON CONFLICT (owner_id, day, kind, model, subject) DO UPDATE SET calls = u.calls + excluded.calls,
    tokens_in = u.tokens_in + excluded.tokens_in,
    tokens_out = u.tokens_out + excluded.tokens_out,
    estimated_calls = u.estimated_calls + excluded.estimated_calls
"""
ERASED_SUBJECT = "(erased)"


def usage_subject_erase(*, owner_id: int, subject: str) -> None:
    """The owner's usage rows about ``subject`` (an erased scope's label, ``user/alice``)
    keep their counts (the owner's bill) under ``ERASED_SUBJECT``, merged with any
    already there: no row names the subject any more."""
    if not subject:
        return
    with connection.cursor() as cur:
        cur.execute(_ERASE_SQL, {"owner": owner_id, "subject": subject[:255],
                                 "erased": ERASED_SUBJECT})  # fmt: skip


def scope_erase_usage(*, owner_id: int, scope: list[str], **_: Any) -> None:
    """Receiver of ``core.erasure.scope_erased``: the scope's usage rows no longer name
    it (its subject is its label, ``"/".join(scope)``: ``user/<end user id>``)."""
    usage_subject_erase(owner_id=owner_id, subject="/".join(scope))


# Counts made while this thread's database connection was busy (a finaliser run by the
# garbage collector inside a database call would otherwise wait for the connection's own
# lock forever): written by the next count.
_late: deque[dict[str, Any]] = deque()


def _busy() -> bool:
    """Whether this thread's connection is in the middle of a call (psycopg holds its
    lock): a Django connection belongs to one thread, so this thread holds it."""
    lock = getattr(connection.connection, "lock", None)
    return lock is not None and lock.locked()


def usage_record(*, model: str, tokens_in: int, tokens_out: int, estimated: bool) -> None:
    """Count one call of the attributed work (``usage_for``). Never raises: a failure to
    count is logged, and the call's answer goes on."""
    who = _current.get() or Attribution(None, "other")
    params: dict[str, Any] = {
        "kind": who.kind, "model": (model or "unknown")[:200], "tin": max(0, int(tokens_in)),
        "tout": max(0, int(tokens_out)), "est": int(estimated), "owner": who.owner_id,
        "day": timezone.now().date(), "subject": who.subject[:255],
    }  # fmt: skip
    note_usage(kind=who.kind, model=params["model"], tokens_in=params["tin"],
               tokens_out=params["tout"], estimated=estimated)  # fmt: skip
    if _busy():
        _late.append(params)
        return
    while _late:  # (counts kept while a connection was busy)
        try:
            _write(_late.popleft())
        except IndexError:  # another thread wrote it
            break
    _write(params)


def _write(params: dict[str, Any]) -> None:
    try:
        # Outside a transaction: one statement, committed without waiting for the WAL's
        # flush to disk (``set_config(..., true)`` holds for its own implicit
        # transaction), so a count costs the request one round trip and no fsync; a
        # database crash may lose the last fraction of a second of counts, nothing else.
        # Inside a caller's transaction it is part of it (and of its commit).
        sql = _RECORD_SQL if connection.in_atomic_block else _ASYNC_SQL
        with connection.cursor() as cur:
            cur.execute(sql, params)
    except DatabaseError:
        log.warning("usage not recorded", extra={"kind": params["kind"], "model": params["model"]},
                    exc_info=True)  # fmt: skip


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content blocks
            content = " ".join(str(b.get("text") or "") for b in content if isinstance(b, dict))
        parts.append(str(content or ""))
    return "\n".join(parts)


def record_chat(model: str, usage: Any, messages: Any, answer_text: str) -> None:
    """A chat call's usage: the provider's ``usage`` (prompt and completion tokens), or
    counted with the tokenizer from the request's messages and the answer's text."""
    if isinstance(usage, dict) and usage.get("prompt_tokens") is not None:
        usage_record(model=model, tokens_in=int(usage.get("prompt_tokens") or 0),
                     tokens_out=int(usage.get("completion_tokens") or 0), estimated=False)  # fmt: skip
        return
    usage_record(model=model, tokens_in=count_tokens(_messages_text(messages)),
                 tokens_out=count_tokens(answer_text or ""), estimated=True)  # fmt: skip


# --- budgets -------------------------------------------------------------------------
# The background work an owner's daily budget bounds. The chat proxy's own answers are
# never held back: its caller pays for them directly and is waiting.
BUDGETED_KINDS = ("extraction", "dream", "memory_base")


@dataclass(frozen=True)
class Budget:
    """An owner's budget on ``day``: ``daily_tokens`` (None: no cap) and what the
    budgeted work spent that day."""

    daily_tokens: int | None
    spent: int
    day: date
    deferred_runs: int = 0
    deferred_at: datetime | None = None

    @property
    def exhausted(self) -> bool:
        return self.daily_tokens is not None and self.spent >= self.daily_tokens

    @property
    def resets_at(self) -> datetime:
        return datetime.combine(self.day + timedelta(days=1), time.min, tzinfo=UTC)


def budget_of(owner_id: int, now: datetime | None = None) -> Budget:
    """The owner's budget and spending on the day of ``now`` (UTC)."""
    from core.models import UsageBudget, UsageDay

    day = (now or timezone.now()).astimezone(UTC).date()
    row = UsageBudget.objects.filter(owner_id=owner_id).first()
    cap = row.daily_tokens if row is not None and row.daily_tokens is not None else None
    if cap is None:
        cap = settings.USAGE_DAILY_TOKEN_BUDGET or None
    spent = UsageDay.objects.filter(owner_id=owner_id, day=day, kind__in=BUDGETED_KINDS).aggregate(
        total=Sum(F("tokens_in") + F("tokens_out"))
    )["total"]
    if row is None or row.deferred_at is None or row.deferred_at.astimezone(UTC).date() != day:
        return Budget(cap, int(spent or 0), day)
    return Budget(cap, int(spent or 0), day, row.deferred_runs, row.deferred_at)


def budget_spent(owner_id: int, kind: str, *, what: str,
                 now: datetime | None = None) -> Budget | None:  # fmt: skip
    """The owner's budget when ``kind`` of its work may not call the LLM now (its
    ``resets_at`` says until when), None when it may. A deferral is counted
    (``usage_deferred_total``, the owner's ``deferred_runs``) and logged; the caller
    keeps the work for after the reset."""
    if kind not in BUDGETED_KINDS:
        return None
    now = now or timezone.now()
    budget = budget_of(owner_id, now)
    if not budget.exhausted:
        return None
    _deferred(owner_id, budget, now)
    counter_add("usage_deferred_total")
    log.info(json.dumps({
        "event": "usage_deferred", "owner": owner_id, "kind": kind, "what": what,
        "daily_tokens": budget.daily_tokens, "spent": budget.spent,
        "until": budget.resets_at.isoformat(),
    }))  # fmt: skip
    return budget


def _deferred(owner_id: int, budget: Budget, now: datetime) -> None:
    from core.models import UsageBudget

    runs = budget.deferred_runs + 1
    UsageBudget.objects.update_or_create(
        owner_id=owner_id, defaults={"deferred_at": now, "deferred_runs": runs}
    )


def budget_set(*, owner_id: int, daily_tokens: int | None) -> Budget:
    """Set the owner's daily budget (None: the deployment's default)."""
    from core.models import UsageBudget

    UsageBudget.objects.update_or_create(owner_id=owner_id,
                                         defaults={"daily_tokens": daily_tokens})  # fmt: skip
    return budget_of(owner_id)
