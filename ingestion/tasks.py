"""Thin django-q2 tasks: take ids, call one service. Safe to run twice."""

from __future__ import annotations

from ingestion import services
from ingestion.node_memory import node_memory_delete_idle
from ingestion.services import session_ingest_run


def ingest_session(job_id: str) -> str:
    job = session_ingest_run(job_id=job_id)
    return job.status if job is not None else "skipped"


def node_memory_cleanup() -> int:
    """Daily (schedule ``node-memory-cleanup``): delete idle conversations' node memory."""
    return node_memory_delete_idle()


def memory_base_jobs_sweep() -> int:
    """Every 5 minutes (schedule ``memory-base-jobs-sweep``): resume abandoned jobs."""
    return services.memory_base_jobs_sweep()
