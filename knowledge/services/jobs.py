"""Background ingest jobs (large document batches): accept, run in order per base, sweep."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.db import advisory_session_lock
from core.db_recovery import read_after_commit
from core.jobs import job_claim, job_finish, job_outcome, job_stale
from core.queue import enqueue, enqueue_on_commit
from knowledge.models import IngestJob, KnowledgeBase
from knowledge.services.bases import knowledge_base_writable
from knowledge.services.errors import DocumentIn, IngestResult
from knowledge.services.ingest import _check_batch, knowledge_base_ingest

logger = logging.getLogger(__name__)


def knowledge_ingest_job_create(
    *, knowledge_base: KnowledgeBase, documents: Sequence[DocumentIn]
) -> IngestJob:
    """Store a batch for background ingestion and queue it once committed.

    The batch is checked as the synchronous path would check it, so a bad one is
    refused here (KnowledgeError) instead of failing later in its job.
    """
    _check_batch(documents)
    with transaction.atomic():
        job = IngestJob.objects.create(
            knowledge_base=knowledge_base,
            documents=[d.payload() for d in documents],
            document_count=len(documents),
            char_count=sum(len(d.text) for d in documents),
        )
        _enqueue_ingest_job(job, on_commit=True)
    return job


def _enqueue_ingest_job(job: IngestJob, *, on_commit: bool = False) -> None:
    def failed(exc: Exception) -> None:
        IngestJob.objects.filter(pk=job.pk, status=IngestJob.Status.QUEUED).update(
            status=IngestJob.Status.FAILED,
            error=f"could not be queued: {type(exc).__name__}: {exc}",
            finished_at=timezone.now(),
        )

    queue = enqueue_on_commit if on_commit else enqueue
    queue("knowledge.tasks.run_ingest_job", str(job.pk), task_name="ingest-documents",
          owner_id=job.knowledge_base.owner_id, on_error=failed)  # fmt: skip


def _jobs_lock(knowledge_base_id: Any) -> str:
    return f"knowledge:ingest-jobs:{knowledge_base_id}"


def knowledge_documents_submit(
    *,
    knowledge_base: KnowledgeBase,
    documents: Sequence[DocumentIn],
    background: bool | None = None,
) -> IngestResult | IngestJob:
    """Ingest now (IngestResult) or queue a job (IngestJob), keeping a base's order.

    ``background`` None: queue when the batch is over INGEST_SYNC_MAX_CHARS. A batch
    is queued anyway while the base has unfinished jobs or a job runner is at work,
    and a synchronous write holds the base's runner lock, so jobs accepted while it
    embeds wait for it and then run (queued again here once the lock is let go).
    File-backed bases are written by their file sources only.
    """
    knowledge_base_writable(knowledge_base)
    if background is None:
        background = sum(len(d.text) for d in documents) > settings.INGEST_SYNC_MAX_CHARS
    if background:
        return knowledge_ingest_job_create(knowledge_base=knowledge_base, documents=documents)
    result: IngestResult | None = None
    with advisory_session_lock(_jobs_lock(knowledge_base.pk)) as taken:
        if taken and not knowledge_base_has_active_jobs(knowledge_base=knowledge_base):
            result = knowledge_base_ingest(knowledge_base=knowledge_base, documents=documents)
    if result is None:
        return knowledge_ingest_job_create(knowledge_base=knowledge_base, documents=documents)
    # The write has committed: if the database is gone now, the answer is still its
    # result (a 503 would be a lie, and the client would send the batch again); a job
    # left waiting is resumed by the sweep (knowledge_ingest_jobs_sweep).
    waiting = read_after_commit(
        lambda: (
            IngestJob.objects.filter(knowledge_base=knowledge_base, status__in=IngestJob.ACTIVE)
            .defer("documents")
            .first()
        ),
        lambda: None,
    )
    if waiting is not None:  # accepted meanwhile; its run found the lock taken
        _enqueue_ingest_job(waiting)
    return result


def knowledge_ingest_job_run(*, job_id: str) -> IngestJob | None:
    """Run the queued jobs of ``job_id``'s base, oldest first; returns that job as it ends.

    One runner per base at a time (a session-level advisory lock, so no transaction
    stays open while embedding): writes of one base land in the order their batches
    were accepted. A runner that finds the lock taken returns at once; the holder
    takes every queued job of the base and looks again after letting go. Safe to run
    twice: finished jobs are left alone, and the ingestion helper is idempotent.
    """
    job = IngestJob.objects.defer("documents").filter(pk=job_id).first()
    if job is not None:
        knowledge_ingest_jobs_run_for_base(knowledge_base_id=job.knowledge_base_id)
    # None when the base (and with it the job) was deleted.
    return IngestJob.objects.defer("documents").filter(pk=job_id).first()


def knowledge_ingest_jobs_run_for_base(*, knowledge_base_id: Any) -> int:
    """Run the base's unfinished jobs in order unless another runner holds it."""
    ran = 0
    while True:
        with advisory_session_lock(_jobs_lock(knowledge_base_id)) as taken:
            if not taken:
                return ran
            while (job_pk := _next_job(knowledge_base_id)) is not None:
                _run_job(job_pk)
                ran += 1
        # Jobs accepted while we held the lock, whose runs found it taken.
        if _next_job(knowledge_base_id) is None:
            return ran


def _next_job(knowledge_base_id: Any) -> Any:
    # A "running" job here was interrupted (its runner held the lock we now have).
    return (
        IngestJob.objects.filter(knowledge_base_id=knowledge_base_id, status__in=IngestJob.ACTIVE)
        .order_by("created_at", "id")
        .values_list("pk", flat=True)
        .first()
    )


def _run_job(job_pk: Any) -> None:
    job = job_claim(IngestJob, job_pk, related=("knowledge_base",))
    if job is None:
        return
    documents = [
        DocumentIn.from_payload(
            text=d["text"], source_key=d["source_key"], metadata=d.get("metadata")
        )
        for d in job.documents
    ]
    with job_outcome(IngestJob, job.pk):
        result = knowledge_base_ingest(knowledge_base=job.knowledge_base, documents=documents)
        job_finish(
            IngestJob,
            job.pk,
            IngestJob.Status.SUCCEEDED,
            chunks_written=result.chunks_written,
            chunks_deleted=result.chunks_deleted,
            documents=[],
        )


def knowledge_ingest_jobs_sweep(*, stale_seconds: float | None = None) -> int:
    """Resume bases whose jobs wait with nobody running them (a lost task, a worker
    killed mid-run). Bases with a live runner are skipped by its lock."""
    bases = (
        job_stale(IngestJob, stale_seconds=stale_seconds)
        .values_list("knowledge_base_id", flat=True)
        .distinct()
    )
    return sum(knowledge_ingest_jobs_run_for_base(knowledge_base_id=kb) for kb in list(bases))


def knowledge_base_has_active_jobs(*, knowledge_base: KnowledgeBase) -> bool:
    return IngestJob.objects.filter(
        knowledge_base=knowledge_base, status__in=IngestJob.ACTIVE
    ).exists()
