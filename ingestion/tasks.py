"""Thin django-q2 tasks: take ids, call one service. Safe to run twice."""

from __future__ import annotations

from ingestion.services import session_ingest_run


def ingest_session(job_id: str) -> str:
    job = session_ingest_run(job_id=job_id)
    return job.status if job is not None else "skipped"
