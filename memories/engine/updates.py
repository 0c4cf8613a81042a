"""Debounced updates, the recording side: a flush is a row in Postgres, not an item in
a process's memory (DeerFlow's queue loses its pending updates with the process).

``update_record`` stores the flush and arranges for the scope's extraction: at once
(``MEMORY_UPDATE_DEBOUNCE_SECONDS`` = 0, queued after the commit), or through a
django-q2 one-off schedule named after the scope, pushed back by every flush
(trailing edge) but never past ``MEMORY_UPDATE_MAX_WAIT_SECONDS`` after the
scope's oldest pending flush. The schedule is written in the flush's transaction.
The run itself is ``ingestion.updates`` (queued by task path); the minute sweep
``ingestion.tasks.engine_updates_sweep`` picks up any scope whose run was lost.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Max, Min, QuerySet
from django.utils import timezone

from core.api.serializers import OPENAI_MESSAGE_KEYS
from core.errors import InvalidInput
from core.providers.llm import get_llm
from core.queue import enqueue_on_commit, owner_group
from core.tracing import traceparent
from memories.engine.models import PendingUpdate
from memories.facts.models import Scope
from memories.facts.scopes import ScopePath, owner_pk, scope_ensure
from memories.facts.timeline import instant

RUN_TASK = "ingestion.tasks.engine_updates_run"
ROLES = ("user", "assistant", "system", "tool")
FEATURE = "Memory updates (POST /api/v1/engine/flush)"


def schedule_name(scope_id: int) -> str:
    return f"engine-updates:{scope_id}"


MESSAGE_ID_CHARS = 255
MESSAGE_KEYS = frozenset({"role", "content", "at", "id"})


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """``[{"role", "content", "at"?, "id"?}]``: 1 to ``RUN_MAX_MESSAGES`` messages with
    text; ``id`` (the client's id of the message, a string or a number) is kept as the
    source of the facts learned from it."""
    if not isinstance(messages, list) or not 1 <= len(messages) <= settings.RUN_MAX_MESSAGES:
        raise InvalidInput(
            f"messages must be a list of 1 to {settings.RUN_MAX_MESSAGES} messages",
            details={"messages": ['a list such as [{"role": "user", "content": "..."}]']},
        )
    out = []
    for i, message in enumerate(messages):
        _refuse_unknown_keys(message, i)
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        # (each error names its field by its path, its words as that field's list: the
        # API's error shape, which these broke with a string in nested objects)
        if role not in ROLES:
            raise InvalidInput.at(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}")
        if not isinstance(content, str) or not content.strip():
            raise InvalidInput.at(f"messages[{i}].content", "must be a non-empty string")
        if len(content) > settings.MESSAGE_MAX_CHARS:
            raise InvalidInput.at(
                f"messages[{i}].content",
                f"is longer than {settings.MESSAGE_MAX_CHARS} characters",
            )
        item: dict[str, Any] = {"role": role, "content": content}
        if at := _message_at(message.get("at"), i):  # (stored as read: a run parses it)
            item["at"] = at
        if message.get("id") is not None:
            item["id"] = _message_id(message["id"], i)
        out.append(item)
    return out


def _refuse_unknown_keys(message: Any, index: int) -> None:
    """A key that names no field of a message is a 400 naming it, as the summaries' and
    the user memories' messages do ("confidance": 0.9 was taken and dropped); an OpenAI
    message's other keys are dropped, an agent's list being sent as it is."""
    if not isinstance(message, dict):
        return
    unknown = sorted(str(k) for k in set(message) - MESSAGE_KEYS - OPENAI_MESSAGE_KEYS)
    if unknown:
        details = {f"messages[{index}].{key}": [f"Unknown field {key}."] for key in unknown}
        raise InvalidInput(
            "; ".join(f"{path}: {said[0]}" for path, said in details.items()), details=details
        )


def _message_at(value: Any, index: int) -> str:
    """When a message was said: an ISO 8601 time (``instant``; a date, or without a zone,
    UTC), as an ISO 8601 time with its zone; "" for none (null, or blank)."""
    name = f"messages[{index}].at"
    if value is not None and not isinstance(value, str):
        raise InvalidInput.at(name, "must be an ISO 8601 time")
    when = instant(value.strip() if value else None, name)
    return "" if when is None else when.isoformat()


def _message_id(value: Any, index: int) -> str:
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if not text.strip() or len(text) > MESSAGE_ID_CHARS or "," in text:
        raise InvalidInput.at(
            f"messages[{index}].id",
            f"must be a string (1-{MESSAGE_ID_CHARS} characters, no comma) or a number",
        )
    return text.strip()


def update_record(
    *,
    owner: AbstractBaseUser | int,
    scope: ScopePath | Scope,
    messages: Any,
    source: str = "api",
    now: datetime | None = None,
    require_llm: bool = True,
    debounce: float | None = None,
    arrange: bool = True,
) -> PendingUpdate:
    """Store one flush of ``scope`` and arrange its (debounced) extraction; returns at once.

    Invalid messages raise ``InvalidInput``; without an LLM (``require_llm``) it raises
    ``ProviderNotConfigured`` (503, naming ``LLM_BASE_URL``); either way nothing is
    written. The row, and the schedule that will run it, commit together.
    ``debounce`` overrides ``MEMORY_UPDATE_DEBOUNCE_SECONDS``; ``arrange=False`` queues
    nothing (a caller holding the scope's run lock runs it itself; if it dies first,
    the sweep finds the flush due).
    """
    checked = validate_messages(messages)
    if require_llm:
        get_llm(feature=FEATURE)
    now = now or timezone.now()
    debounce = settings.MEMORY_UPDATE_DEBOUNCE_SECONDS if debounce is None else debounce
    with transaction.atomic():
        row = scope if isinstance(scope, Scope) else scope_ensure(owner=owner, scope=scope)
        oldest = pending_of(row.pk).aggregate(first=Min("created_at"))["first"] or now
        due = min(
            now + timedelta(seconds=debounce),
            max(now, oldest + timedelta(seconds=settings.MEMORY_UPDATE_MAX_WAIT_SECONDS)),
        )
        update = PendingUpdate.objects.create(
            owner_id=row.owner_id,
            scope=row,
            messages=checked,
            source=source,
            due_at=due,
            created_at=now,
            traceparent=traceparent(),
        )
        if not arrange:
            pass
        elif debounce <= 0:
            enqueue_on_commit(RUN_TASK, row.pk, task_name=f"engine-updates-{row.pk}",
                              owner_id=row.owner_id)  # fmt: skip
        else:
            schedule_run(row.pk, due, owner_id=row.owner_id)
    return update


def schedule_run(scope_id: int, at: datetime, *, owner_id: int) -> None:
    """(Re)schedule the scope's run at ``at``: one django-q2 ONCE schedule per scope,
    deleted by django-q2 after it fires; its task waits in the owner's lane
    (``core.broker``: the group in the schedule's ``q_options``)."""
    from django_q.models import Schedule

    options = {"q_options": {"group": owner_group(owner_id)}}
    Schedule.objects.update_or_create(
        name=schedule_name(scope_id),
        defaults={"func": RUN_TASK, "args": str(int(scope_id)), "kwargs": repr(options),
                  "schedule_type": Schedule.ONCE, "next_run": at, "repeats": -1},
    )  # fmt: skip


def pending_of(scope_id: int) -> QuerySet[PendingUpdate]:
    return PendingUpdate.objects.filter(scope_id=scope_id, status=PendingUpdate.Status.PENDING)


def due_scopes(*, now: datetime | None = None) -> list[int]:
    """Scopes whose newest pending flush is due: what the sweep runs."""
    return [scope_id for scope_id, _ in due_scopes_of_owners(now=now)]


def due_scopes_of_owners(*, now: datetime | None = None) -> list[tuple[int, int]]:
    """(scope, its owner) of each scope whose newest pending flush is due."""
    now = now or timezone.now()
    rows = (
        PendingUpdate.objects.filter(status=PendingUpdate.Status.PENDING)
        .values("scope_id", "owner_id")
        .annotate(due=Max("due_at"))
        .filter(due__lte=now)
        .order_by("due")
    )
    return [(r["scope_id"], r["owner_id"]) for r in rows]


def update_list(*, owner: AbstractBaseUser | int, scope: Scope) -> QuerySet[PendingUpdate]:
    return PendingUpdate.objects.filter(owner_id=owner_pk(owner), scope=scope).order_by("-id")
