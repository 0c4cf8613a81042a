"""Thin django-q2 tasks: take ids and immutable arguments, call one service. Each is
safe to run twice. Their dotted paths are what queues and schedules store."""

from __future__ import annotations

import logging
from datetime import date

from django.conf import settings
from django.db import transaction
from django.utils.dateparse import parse_datetime

from core.tenancy import maintenance
from ingestion import memory_bases, updates
from memories.conversations.node_memory import node_memory_delete_idle
from memories.engine.dreams import dream_scheduled, dreams_daily
from memories.engine.updates import update_record
from memories.facts.models import Scope
from memories.facts.scopes import user_scope
from memories.facts.services import scope_held_if_there

logger = logging.getLogger(__name__)


def ingest_session(job_id: str) -> str:
    """A Memory Base job (queued by ``memories.bases.services``)."""
    job = memory_bases.session_ingest_run(job_id=job_id)
    return job.status if job is not None else "skipped"


@maintenance("task memory_base_jobs_sweep")
def memory_base_jobs_sweep() -> int:
    """Every 5 minutes (schedule ``memory-base-jobs-sweep``): resume abandoned jobs."""
    return memory_bases.memory_base_jobs_sweep()


@maintenance("task node_memory_cleanup")
def node_memory_cleanup() -> int:
    """Daily (schedule ``node-memory-cleanup``): delete idle conversations' node memory."""
    return node_memory_delete_idle()


def form_memories(
    owner_id: int,
    external_id: str,
    message: str,
    message_at: str,
    message_id: str = "",
    scope_id: int | None = None,
) -> int:
    """After a chat answer (queued by the chat proxy): the user's message joins the
    debounced updates of the scope ``["user", external_id]`` (one extraction per
    debounce window, however many messages). ``message_id``: the message as the proxy
    recorded it (with a chat id), the source of the facts learned from it. ``scope_id``:
    the end user's scope as the chat found it; erased since (the end user's memories
    deleted while the answer streamed), nothing is learned and none is made again.
    Returns the pending update's id (0: erased)."""
    at = parse_datetime(message_at)
    if at is None:  # queued by the chat proxy as isoformat(): never
        raise ValueError(f"not an ISO 8601 date-time: {message_at!r}")
    message = message[: settings.MESSAGE_MAX_CHARS]
    item = {"role": "user", "content": message, "at": at.isoformat()}
    if message_id:
        item["id"] = str(message_id)
    if scope_id is None:  # (queued before the chats named their scope)
        return update_record(owner=owner_id, scope=user_scope(external_id), messages=[item],
                             source="chat", require_llm=False).pk  # fmt: skip
    with transaction.atomic():  # under the erasure's lock: recorded before it, or not at all
        found = Scope.objects.filter(pk=scope_id, owner_id=owner_id).first()
        if found is None or not scope_held_if_there(found):
            logger.info("a chat's message not learned: its end user was erased since")
            return 0
        update = update_record(
            owner=owner_id,
            scope=found,
            messages=[item],
            source="chat",
            require_llm=False,  # recorded either way; the run waits for an LLM
        )
    return update.pk


def engine_updates_run(scope_id: int) -> str:
    """A scope's debounced updates, once due (queued by a flush, its schedule or the sweep)."""
    return updates.updates_run(scope_id=int(scope_id)).status


@maintenance("task engine_updates_sweep")
def engine_updates_sweep() -> int:
    """Every minute (schedule ``engine-updates-sweep``): run scopes whose updates are due."""
    return updates.updates_sweep()


@maintenance("task engine_dreams_daily")
def engine_dreams_daily() -> int:
    """Daily (schedule ``engine-dreams``): queue a dream of each scope whose facts or
    journal changed since its last dream, of owners who have not turned it off."""
    return dreams_daily()


def engine_dream_scope(scope_id: int, day: str) -> str:
    """One scope's daily dream (queued by ``engine_dreams_daily``); safe to run twice."""
    return dream_scheduled(scope_id=int(scope_id), day=date.fromisoformat(day))
