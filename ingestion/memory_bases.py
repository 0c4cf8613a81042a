"""The Memory Base job runner: ingest a session's pending outputs into its memory
base's knowledge base, exactly once.

Invariants:
- The cursor moves only after the chunks of the messages it passes are committed
  (``knowledge_base_ingest`` returns after its commit; the cursor update is a
  separate, later transaction). Chunk source keys derive from message ids, so a
  crash between the two makes the next run rewrite the same rows, not duplicates.
- A job's scope (start cursor, last message) is fixed when it is queued
  (``memories.bases.services.session_ingest_enqueue``).
- Lifecycle (claim, attempts, interruption, sweep): ``core.jobs``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db.models import F, QuerySet
from django.utils import timezone

from core.jobs import job_claim, job_finish, job_outcome, job_run_lock, job_stale
from core.providers.llm import get_llm
from core.queue import owner_group
from core.usage import budget_spent, usage_for
from knowledge.services import DocumentIn, IngestCancelled, knowledge_base_ingest
from memories.bases.models import MemoryBase, MemoryBaseJob, MemoryBaseSession
from memories.bases.services import session_cursor_advance, session_ingest_continue
from memories.conversations.models import Message
from memories.conversations.selectors import outputs_in_scope

logger = logging.getLogger(__name__)
INGEST_BATCH_MESSAGES = 200
TASK = "ingestion.tasks.ingest_session"


class _Deferred(Exception):
    """The owner's budget for background work is spent until ``until``."""

    def __init__(self, until: datetime):
        self.until = until


def _cancelled(job_id: Any) -> bool:
    state = (
        MemoryBaseJob.objects.filter(pk=job_id).values_list("cancel_requested", flat=True).first()
    )
    return state is None or bool(state)  # a deleted job counts as cancelled


def _batch_to_documents(memory_base: MemoryBase, batch: list[Message]) -> list[DocumentIn]:
    if memory_base.preprocess:
        return _preprocess(memory_base, batch)
    return [
        DocumentIn(
            text=m.text,
            source_key=f"message:{m.pk}",
            message_id=m.message_id or str(m.pk),  # the caller's id when it gave one
            session_id=m.session_id,
            flow_id=str(m.flow_id),
            run_id=m.run_id,
            sender=m.sender,
            timestamp=m.created_at,
            source_type="message",
            metadata={"role": m.role},
        )
        for m in batch
        if m.text.strip()
    ]


def _preprocess(memory_base: MemoryBase, batch: list[Message]) -> list[DocumentIn]:
    """Let the LLM distil the batch into one document (or nothing, on the kill phrase)."""
    llm = get_llm(feature="Memory-base preprocessing")
    transcript = "\n".join(f"{m.sender or m.role}: {m.text}" for m in batch)
    instructions = memory_base.preprocess_instructions or (
        "Summarise the durable facts and outcomes in these messages for later retrieval."
    )
    if memory_base.preprocess_kill_phrase:
        instructions += (
            f"\nIf nothing is worth storing, answer exactly: {memory_base.preprocess_kill_phrase}"
        )
    kwargs: dict[str, Any] = {"temperature": 0}
    if memory_base.preprocess_model:
        kwargs["model"] = memory_base.preprocess_model
    owner_id = memory_base.knowledge_base.owner_id
    with usage_for(owner_id=owner_id, kind="memory_base", subject=f"memory base {memory_base.pk}"):
        result = llm.complete(
            [{"role": "system", "content": instructions}, {"role": "user", "content": transcript}],
            **kwargs,
        )
    text = result.content.strip()
    kill = memory_base.preprocess_kill_phrase.strip()
    if not text or (kill and kill.lower() in text.lower()):
        return []
    first, last = batch[0], batch[-1]
    return [
        DocumentIn(
            text=text,
            source_key=f"batch:{first.pk}-{last.pk}",
            session_id=first.session_id,
            flow_id=str(first.flow_id),
            run_id=last.run_id,
            timestamp=last.created_at,
            source_type="memory_summary",
            metadata={"first_message_id": first.pk, "last_message_id": last.pk},
        )
    ]


def session_ingest_run(
    *, job_id: Any, progress: Callable[[int, int], None] | None = None
) -> MemoryBaseJob | None:
    """Run one queued job: ingest its scope in batches, advancing the cursor after each.

    Starts from the later of the job's start cursor and the session's cursor (a
    rerun after a crash resumes, it does not redo). Checks for cancellation
    between batches. On failure the job is marked failed and the cursor stays at
    the last committed batch, so the next run resumes from there. Returns None
    when another live run holds the job, or it is gone, finished or given up
    (lifecycle: ``core.jobs``).
    """
    with job_run_lock(MemoryBaseJob, job_id) as free:
        if not free:
            return None
        job = job_claim(MemoryBaseJob, job_id, related=("session", "memory_base__knowledge_base"))
        if job is None:
            return None
        with job_outcome(MemoryBaseJob, job.pk):
            try:
                _finish(job, _ingest(job, progress))
            except _Deferred as deferred:
                _defer(job, deferred.until)
    return MemoryBaseJob.objects.select_related("session").filter(pk=job.pk).first()


def _finish(job: MemoryBaseJob, status: str) -> None:
    """Record how the job ended; a success then queues the session's next job if outputs
    captured meanwhile reach the threshold (``session_ingest_continue``). Two
    transactions: in one, the job's row changed while the next job's insert waited on a
    run's trigger inserting its own, which waited on that row: a deadlock, which
    PostgreSQL broke after a second. (A worker killed between the two leaves those
    outputs for the session's next run or flush, as before.)"""
    job_finish(MemoryBaseJob, job.pk, status)
    if status == MemoryBaseJob.Status.SUCCEEDED:
        session_ingest_continue(session_pk=job.session_id)


def _ingest(job: MemoryBaseJob, progress: Callable[[int, int], None] | None) -> str:
    """The claimed job's batches; returns how it ended (succeeded or cancelled)."""
    session = MemoryBaseSession.objects.select_related("memory_base__knowledge_base").get(
        pk=job.session_id
    )
    memory_base, kb = session.memory_base, session.memory_base.knowledge_base
    total = _scope(session, job).count()
    done = 0
    try:
        while not _cancelled(job.pk):
            batch = list(_scope(session, job)[:INGEST_BATCH_MESSAGES])
            if not batch:
                return MemoryBaseJob.Status.SUCCEEDED
            if memory_base.preprocess and job.trigger == MemoryBaseJob.Trigger.AUTO:
                spent = budget_spent(kb.owner_id, "memory_base", what=f"memory base job {job.pk}")
                if spent is not None:
                    raise _Deferred(spent.resets_at)
            documents = _batch_to_documents(memory_base, batch)
            if documents:
                result = knowledge_base_ingest(
                    knowledge_base=kb, documents=documents, should_cancel=lambda: _cancelled(job.pk)
                )
                MemoryBaseJob.objects.filter(pk=job.pk).update(
                    chunks_written=F("chunks_written") + result.chunks_written
                )
            last = batch[-1]
            session_cursor_advance(
                session=session,
                last_created_at=last.created_at,
                last_id=last.pk,
                count=len(batch),
                job_id=job.pk,
            )
            done += len(batch)
            if progress:
                progress(done, total)
    except IngestCancelled:
        pass
    return MemoryBaseJob.Status.CANCELLED


def _defer(job: MemoryBaseJob, until: datetime) -> None:
    """An automatic job of a preprocessing base meets a spent budget (before its first
    batch, or between two): it goes back to the queue, the claim not counted against
    its attempts, with what it committed kept (the session's cursor), and runs when the
    budget resets. A job a caller asked for (``manual``, ``regenerate``) is never held."""
    from django_q.models import Schedule

    MemoryBaseJob.objects.filter(pk=job.pk).update(
        status=MemoryBaseJob.Status.QUEUED, started_at=None, attempts=F("attempts") - 1,
        deferred_until=until,
    )  # fmt: skip
    options = {"q_options": {"group": owner_group(job.memory_base.owner_id)}}  # (its lane)
    Schedule.objects.update_or_create(
        name=f"memory-base-job:{job.pk}",
        defaults={"func": TASK, "args": repr(str(job.pk)), "kwargs": repr(options),
                  "schedule_type": Schedule.ONCE, "next_run": until, "repeats": -1},
    )  # fmt: skip


def memory_base_jobs_sweep(*, stale_seconds: float | None = None) -> int:
    """Resume Memory Base jobs that nobody runs (a lost task, a worker killed mid-run),
    oldest first; a job claimed ``MAX_ATTEMPTS`` times is given up (failed), which
    frees its session. Jobs with a live run are skipped (their run lock is held), and
    so are jobs deferred by a spent budget until it resets."""
    stale = (
        job_stale(MemoryBaseJob, stale_seconds=stale_seconds)
        .exclude(deferred_until__gt=timezone.now())
        .order_by("created_at", "id")
    )
    ran = 0
    for job_id in list(stale.values_list("pk", flat=True)):
        ran += session_ingest_run(job_id=job_id) is not None
    return ran


def _scope(session: MemoryBaseSession, job: MemoryBaseJob) -> QuerySet[Message]:
    """The job's outputs still after the session's cursor, in order."""
    return outputs_in_scope(
        flow_id=session.memory_base.flow_id,
        session_id=session.session_id,
        after=(session.cursor_created_at, session.cursor_message_id),
        up_to=(job.last_message_created_at, job.last_message_id),
    )
