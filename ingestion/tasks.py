"""Thin django-q2 tasks: take ids and immutable arguments, call one service. Each is
safe to run twice. Their dotted paths are what queues and schedules store."""

from __future__ import annotations

from django.utils.dateparse import parse_datetime

from ingestion import memory_bases
from memories.conversations.node_memory import node_memory_delete_idle
from memories.personal.formation import memory_formation_run


def ingest_session(job_id: str) -> str:
    """A Memory Base job (queued by ``memories.bases.services``)."""
    job = memory_bases.session_ingest_run(job_id=job_id)
    return job.status if job is not None else "skipped"


def memory_base_jobs_sweep() -> int:
    """Every 5 minutes (schedule ``memory-base-jobs-sweep``): resume abandoned jobs."""
    return memory_bases.memory_base_jobs_sweep()


def node_memory_cleanup() -> int:
    """Daily (schedule ``node-memory-cleanup``): delete idle conversations' node memory."""
    return node_memory_delete_idle()


def form_memories(owner_id: int, external_id: str, message: str, message_at: str) -> int:
    """After a chat answer (queued by the chat proxy): learn facts from the message."""
    observed = parse_datetime(message_at)
    if observed is None:  # queued by the chat proxy as isoformat(): never
        raise ValueError(f"not an ISO 8601 date-time: {message_at!r}")
    decisions = memory_formation_run(
        owner_id=owner_id, external_id=external_id, message=message, message_at=observed
    )
    return len(decisions)
