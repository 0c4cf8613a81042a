"""Thin django-q2 tasks for knowledge bases. Safe to run twice."""

from __future__ import annotations

from core.tenancy import maintenance
from knowledge.services import (
    enqueue_chunk_indexing,
    knowledge_index_pending,
    knowledge_ingest_job_run,
    knowledge_ingest_jobs_sweep,
)


def run_ingest_job(job_id: str) -> str:
    job = knowledge_ingest_job_run(job_id=job_id)
    return job.status if job is not None else "gone"


@maintenance("task index_pending_chunks")
def index_pending_chunks() -> int:
    """Queued after ingestion and every 5 minutes (schedule ``index-pending-chunks``):
    add pending chunks to their HNSW index. A run that hits its time budget queues
    its successor, so a large backlog never holds a worker past Q_TIMEOUT."""
    run = knowledge_index_pending()
    if not run.finished and not run.busy:
        enqueue_chunk_indexing()
    return run.indexed


@maintenance("task ingest_jobs_sweep")
def ingest_jobs_sweep() -> int:
    """Every 5 minutes (schedule ``ingest-jobs-sweep``): resume abandoned ingest jobs."""
    return knowledge_ingest_jobs_sweep()
