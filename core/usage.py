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

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from django.db import DatabaseError, connection
from django.utils import timezone

from core.providers.tokens import count_tokens

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attribution:
    owner_id: int | None
    kind: str
    subject: str = ""


_current: ContextVar[Attribution | None] = ContextVar("usage_attribution", default=None)


@contextmanager
def usage_for(*, owner_id: int | None, kind: str, subject: str = "") -> Iterator[None]:
    """Calls made inside are ``owner_id``'s, for ``kind`` of work, about ``subject``."""
    token = _current.set(Attribution(owner_id, kind, subject))
    try:
        yield
    finally:
        _current.reset(token)


@contextmanager
def usage_as(who: Attribution | None) -> Iterator[None]:
    """The calls inside are ``who``'s (as ``usage_for``; None changes nothing)."""
    token = _current.set(who) if who is not None else None
    try:
        yield
    finally:
        if token is not None:
            _current.reset(token)


@contextmanager
def usage_kind(kind: str) -> Iterator[None]:
    """The calls inside are of ``kind``, for the owner and subject already attributed."""
    current = _current.get() or Attribution(None, kind)
    token = _current.set(replace(current, kind=kind))
    try:
        yield
    finally:
        _current.reset(token)


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


def usage_record(*, model: str, tokens_in: int, tokens_out: int, estimated: bool) -> None:
    """Count one call of the attributed work (``usage_for``). Never raises: a failure to
    count is logged, and the call's answer goes on."""
    who = _current.get() or Attribution(None, "other")
    params: dict[str, Any] = {
        "kind": who.kind, "model": (model or "unknown")[:200], "tin": max(0, int(tokens_in)),
        "tout": max(0, int(tokens_out)), "est": int(estimated), "owner": who.owner_id,
        "day": timezone.now().date(), "subject": who.subject[:255],
    }  # fmt: skip
    try:
        with connection.cursor() as cur:
            cur.execute(_RECORD_SQL, params)
    except DatabaseError:
        log.warning("usage not recorded", extra={"kind": who.kind, "model": model}, exc_info=True)


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
