"""Memory Bases: settings, per-session cursors and jobs (queue, cancel, flush, regenerate).

Invariants:
- One active job per (memory base, session): a partial unique index on
  MemoryBaseJob; a second trigger gets ``JobConflict`` naming the active job.
- A job's scope (start cursor, last message) is fixed when it is queued; the job
  runner (``ingestion.memory_bases``) advances the cursor through
  ``session_cursor_advance`` only after the chunks it passes are committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from core.audit import access_record
from core.errors import Conflict, InvalidInput, NameTaken, NotFound
from core.key_limits import resource_create_check
from core.queue import after_commit, enqueue_on_commit
from core.validation import validate_session_id
from knowledge.services import (
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_delete_chunks,
    knowledge_base_recount,
)
from memories.bases.models import MemoryBase, MemoryBaseJob, MemoryBaseSession
from memories.conversations.erasure import sessions_erase
from memories.conversations.models import Flow, Message
from memories.conversations.selectors import (
    outputs_after,
    session_has_messages,
    session_ids_with_outputs,
)
from memories.conversations.services import MessageIn, messages_store

logger = logging.getLogger(__name__)
# Runs a job in this process: (job id, progress(done, total)) -> anything.
JobRunner = Callable[..., object]


class MemoryBaseError(InvalidInput):
    pass


class JobJustFinished(MemoryBaseError):
    """The session's active job finished between the insert that met it and the look."""


class JobConflict(Conflict):
    code = "job_active"

    def __init__(self, job: MemoryBaseJob):
        self.job = job
        super().__init__(
            f"session {job.session.session_id!r} already has an active ingestion job {job.id} "
            f"({job.status})",
            details={
                "job": {
                    "id": str(job.pk),
                    "status": job.status,
                    "session_id": job.session.session_id,
                }
            },
        )


# --- triggers -----------------------------------------------------------------------
def messages_record(
    *, flow: Flow, session_id: str, run_id: str, messages: Sequence[MessageIn]
) -> list[Message]:
    """Store one run's messages and trigger ingestion where a threshold is reached
    (``ingestion_trigger``)."""
    with transaction.atomic():
        stored = messages_store(flow=flow, session_id=session_id, run_id=run_id, messages=messages)
        ingestion_trigger(flow=flow, session_id=session_id)
    return stored


def ingestion_trigger(*, flow: Flow, session_id: str) -> None:
    """After messages of ``session_id`` were stored (in the caller's transaction): for
    each auto-capture memory base of the flow the session row is ensured and, if the
    pending outputs reach the threshold, a job is queued after the commit; the messages
    are committed whatever happens to the trigger (a failure to queue is logged and
    retried at the next trigger)."""
    for session in sessions_due(flow=flow, session_id=session_id):
        after_commit(partial(session_ingest_enqueue_quietly, session=session))


def sessions_due(*, flow: Flow, session_id: str) -> list[MemoryBaseSession]:
    """Sessions of ``flow``'s auto-capture memory bases whose pending outputs reach the
    threshold (their rows ensured on the way)."""
    due = []
    for memory_base in MemoryBase.objects.filter(flow=flow, auto_capture=True):
        session = memory_base_session_ensure(memory_base=memory_base, session_id=session_id)
        session.memory_base = memory_base  # already loaded: no query per trigger check
        if session_pending_count(session=session) >= memory_base.threshold:
            due.append(session)
    return due


def session_ingest_enqueue_quietly(*, session: MemoryBaseSession) -> None:
    """The automatic trigger: queue a job, or log why not (the next trigger retries). A
    job that finished at that very moment is no reason: the job is queued again at once
    (its messages after the finished job's would otherwise wait for the next trigger)."""
    try:
        with transaction.atomic():  # in a caller's transaction, a failure here leaves it usable
            try:
                session_ingest_enqueue(session=session, trigger=MemoryBaseJob.Trigger.AUTO)
            except JobJustFinished:
                session_ingest_enqueue(session=session, trigger=MemoryBaseJob.Trigger.AUTO)
    except JobConflict as exc:
        logger.info("auto-trigger skipped: %s", exc)
    except Exception:  # noqa: BLE001 - the run is stored; the next trigger retries
        logger.exception("could not queue ingestion for session %s", session.pk)


def session_ingest_continue(*, session_pk: int) -> None:
    """After a job of the session succeeded, once that is recorded: the
    outputs captured while it was active had their triggers refused (one active job per
    session), so if the session's pending outputs reach the threshold of its auto-capture
    memory base, the next automatic job is queued now. A concurrent trigger that queues
    it first wins (the database keeps one active job); this one is then logged, skipped.
    A session deleted meanwhile is nothing to do."""
    session = MemoryBaseSession.objects.select_related("memory_base").filter(pk=session_pk).first()
    if session is None or not session.memory_base.auto_capture:
        return
    if session_pending_count(session=session) >= session.memory_base.threshold:
        session_ingest_enqueue_quietly(session=session)


def memory_base_session_ensure(*, memory_base: MemoryBase, session_id: str) -> MemoryBaseSession:
    """The session row, created if missing (safe under concurrent callers)."""
    session, _ = MemoryBaseSession.objects.get_or_create(
        memory_base=memory_base, session_id=session_id
    )
    return session


def _outputs_after_cursor(session: MemoryBaseSession) -> Any:
    return outputs_after(
        flow_id=session.memory_base.flow_id,
        session_id=session.session_id,
        created_at=session.cursor_created_at,
        message_id=session.cursor_message_id,
    )


def session_pending_count(*, session: MemoryBaseSession) -> int:
    return _outputs_after_cursor(session).count()


# --- jobs ---------------------------------------------------------------------------
def session_ingest_enqueue(
    *,
    session: MemoryBaseSession,
    trigger: str,
    run_with: JobRunner | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MemoryBaseJob | None:
    """Queue an ingestion job for everything pending in ``session`` now.

    Returns None when nothing is pending. Raises ``JobConflict`` when the session
    already has an active job (the database refuses a second one). The task
    ``ingestion.tasks.ingest_session`` is queued once the job row commits; with
    ``run_with`` (the runner, from a management command) it runs in this process.
    """
    last = _outputs_after_cursor(session).order_by("-created_at", "-id").first()
    if last is None:
        return None
    try:
        with transaction.atomic():
            job = MemoryBaseJob.objects.create(
                memory_base_id=session.memory_base_id,
                session=session,
                trigger=trigger,
                start_cursor_message_id=session.cursor_message_id,
                start_cursor_created_at=session.cursor_created_at,
                last_message_id=last.pk,
                last_message_created_at=last.created_at,
            )
    except IntegrityError as exc:
        active = session_active_job(session=session)
        if active is None:  # finished in between: let the caller try again
            raise JobJustFinished("the previous job just finished; try again") from exc
        raise JobConflict(active) from exc
    if run_with is not None:
        run_with(job_id=job.pk, progress=progress)
        job.refresh_from_db()
    else:
        _dispatch(job)
    return job


def _dispatch(job: MemoryBaseJob) -> None:
    enqueue_on_commit(
        "ingestion.tasks.ingest_session",
        str(job.pk),
        task_name=f"ingest-{job.pk}",
        owner_id=job.memory_base.owner_id,
        on_queued=lambda task_id: MemoryBaseJob.objects.filter(pk=job.pk).update(task_id=task_id),
        # Free the session's slot, or it would stay blocked by a job nobody runs.
        on_error=lambda exc: MemoryBaseJob.objects.filter(
            pk=job.pk, status=MemoryBaseJob.Status.QUEUED
        ).update(
            status=MemoryBaseJob.Status.FAILED,
            error=f"could not queue: {exc}",
            finished_at=timezone.now(),
        ),
    )


def session_active_job(*, session: MemoryBaseSession) -> MemoryBaseJob | None:
    return (
        MemoryBaseJob.objects.select_related("session")
        .filter(session=session, status__in=MemoryBaseJob.ACTIVE)
        .first()
    )


def session_cursor_advance(
    *,
    session: MemoryBaseSession,
    last_created_at: datetime,
    last_id: int,
    count: int,
    job_id: Any = None,
) -> None:
    """Move the cursor past the message (last_created_at, last_id); never backwards (a
    stale rerun cannot rewind it). The job's count moves with it, so a resumed job
    counts each message once. ``session`` is updated in place."""
    with transaction.atomic():
        fresh = MemoryBaseSession.objects.select_for_update().get(pk=session.pk)
        cursor = (fresh.cursor_created_at, fresh.cursor_message_id)
        behind = fresh.cursor_message_id is None or cursor < (last_created_at, last_id)
        if behind:
            fresh.cursor_message_id, fresh.cursor_created_at = last_id, last_created_at
            fresh.total_processed += count
            fresh.last_sync_at = timezone.now()
            fresh.save(
                update_fields=[
                    "cursor_message_id",
                    "cursor_created_at",
                    "total_processed",
                    "last_sync_at",
                ]
            )
            MemoryBaseJob.objects.filter(pk=job_id).update(
                messages_processed=F("messages_processed") + count
            )
        session.cursor_message_id, session.cursor_created_at = (
            fresh.cursor_message_id,
            fresh.cursor_created_at,
        )


# --- memory bases -------------------------------------------------------------------
KB_NAME_CHARS = 200  # (KnowledgeBase.name)


def memory_base_create(
    *,
    owner: User,
    name: str,
    flow: Flow,
    threshold: int = 10,
    auto_capture: bool = True,
    kb_name: str | None = None,
    preprocess: bool = False,
    preprocess_model: str = "",
    preprocess_instructions: str = "",
    preprocess_kill_phrase: str = "",
) -> MemoryBase:
    """Create a memory base and its knowledge base (flagged ``is_memory_base``) together."""
    resource_create_check("memory_bases")
    if threshold < 1:
        raise MemoryBaseError("threshold must be at least 1")
    if flow.owner_id != owner.pk:
        raise MemoryBaseError("unknown flow")
    kb_name = kb_name or f"Memory: {name}"[:KB_NAME_CHARS]  # (a name of 193-200: cut)
    with transaction.atomic():
        if MemoryBase.objects.filter(owner=owner, name=name).exists():
            raise NameTaken(f"a memory base named {name!r} already exists")
        try:
            kb = knowledge_base_create(owner=owner, name=kb_name, is_memory_base=True)
        except NameTaken as exc:
            raise NameTaken(f"a knowledge base named {kb_name!r} already exists") from exc
        try:
            with transaction.atomic():
                return MemoryBase.objects.create(
                    owner=owner,
                    name=name,
                    flow=flow,
                    threshold=threshold,
                    knowledge_base=kb,
                    kb_name=kb_name,
                    auto_capture=auto_capture,
                    preprocess=preprocess,
                    preprocess_model=preprocess_model,
                    preprocess_instructions=preprocess_instructions,
                    preprocess_kill_phrase=preprocess_kill_phrase,
                )
        except IntegrityError as exc:
            raise NameTaken(f"a memory base named {name!r} already exists") from exc


UPDATABLE = (
    "name",
    "threshold",
    "auto_capture",
    "preprocess",
    "preprocess_model",
    "preprocess_instructions",
    "preprocess_kill_phrase",
)


def memory_base_update(*, memory_base: MemoryBase, **changes: Any) -> MemoryBase:
    """Change settings. A new threshold counts from the next trigger; queued and
    running jobs keep the scope they were given."""
    unknown = set(changes) - set(UPDATABLE)
    if unknown:
        raise MemoryBaseError(f"cannot change {', '.join(sorted(unknown))}")
    if "threshold" in changes and changes["threshold"] < 1:
        raise MemoryBaseError("threshold must be at least 1")
    for key, value in changes.items():
        setattr(memory_base, key, value)
    try:
        with transaction.atomic():
            memory_base.save(update_fields=list(changes))
    except IntegrityError as exc:
        raise NameTaken(f"a memory base named {changes.get('name')!r} already exists") from exc
    return memory_base


def memory_base_cancel_jobs(*, memory_base: MemoryBase, session_id: str | None = None) -> int:
    """Ask active jobs to stop; queued ones are cancelled at once, running ones stop
    at their next batch boundary (before writing anything more)."""
    jobs = MemoryBaseJob.objects.filter(memory_base=memory_base, status__in=MemoryBaseJob.ACTIVE)
    if session_id is not None:
        jobs = jobs.filter(session__session_id=session_id)
    count = jobs.update(cancel_requested=True)
    MemoryBaseJob.objects.filter(
        pk__in=jobs.values("pk"), status=MemoryBaseJob.Status.QUEUED
    ).update(status=MemoryBaseJob.Status.CANCELLED, finished_at=timezone.now())
    _delete_queued_tasks(memory_base)
    return count


def _delete_queued_tasks(memory_base: MemoryBase) -> None:
    from django_q.models import OrmQ

    names = {f"ingest-{pk}" for pk in memory_base.jobs.values_list("pk", flat=True)}
    for item in OrmQ.objects.all():
        try:
            if item.name() in names:
                item.delete()
        except Exception:  # noqa: BLE001 - an undecodable entry is not ours
            continue


def _wait_for_running(memory_base: MemoryBase, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not MemoryBaseJob.objects.filter(
            memory_base=memory_base, status=MemoryBaseJob.Status.RUNNING
        ).exists():
            return
        time.sleep(0.05)


def memory_base_delete(*, memory_base: MemoryBase, wait_seconds: float = 10.0) -> None:
    """Cancel the memory base's jobs, then delete it and its knowledge base.

    A running job checks for cancellation between batches; its in-flight write
    either commits before the delete (and is deleted with the base) or fails on
    the vanished base. Nothing is left behind either way.
    """
    memory_base_cancel_jobs(memory_base=memory_base)
    _wait_for_running(memory_base, wait_seconds)
    kb = memory_base.knowledge_base
    with transaction.atomic():
        memory_base.delete()
        knowledge_base_delete(knowledge_base=kb)


def memory_base_flush(
    *,
    memory_base: MemoryBase,
    session_id: str | None = None,
    trigger: str = MemoryBaseJob.Trigger.MANUAL,
) -> list[MemoryBaseJob]:
    """Queue ingestion for every session with pending outputs (or one), ignoring the
    threshold. Raises ``JobConflict`` if a targeted session already has an active job;
    then nothing is queued."""
    if session_id is not None:
        validate_session_id(session_id)
        _require_session(memory_base, session_id)
        sessions = [memory_base_session_ensure(memory_base=memory_base, session_id=session_id)]
    else:
        _discover_sessions(memory_base)
        sessions = list(memory_base.sessions.order_by("session_id"))
    for session in sessions:
        active = session_active_job(session=session)
        if active is not None:
            raise JobConflict(active)
    jobs = []
    for session in sessions:
        job = session_ingest_enqueue(session=session, trigger=trigger)
        if job is not None:
            jobs.append(job)
    return jobs


def _require_session(memory_base: MemoryBase, session_id: str) -> None:
    """A session the memory base knows or its flow has messages in; else ``NotFound``
    (a flush of a mistyped session used to create it, empty, and answer 202)."""
    if memory_base.sessions.filter(session_id=session_id).exists():
        return
    if not session_has_messages(flow_id=memory_base.flow_id, session_id=session_id):
        raise NotFound(
            "no such session in this memory base's flow",
            code="session_not_found",
            details={"session_id": session_id},
        )


def _discover_sessions(memory_base: MemoryBase) -> None:
    """Sessions of the flow that have outputs but no session row yet (e.g. messages
    captured before the memory base existed)."""
    known = set(memory_base.sessions.values_list("session_id", flat=True))
    for session_id in session_ids_with_outputs(flow_id=memory_base.flow_id) - known:
        memory_base_session_ensure(memory_base=memory_base, session_id=session_id)


def memory_base_regenerate(
    *,
    memory_base: MemoryBase,
    session_id: str | None = None,
    run_with: JobRunner | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[MemoryBaseJob]:
    """Reset cursors, clear the stored chunks and re-ingest from the start.

    For all sessions, or one. Refuses with ``JobConflict`` while a job is active.
    With ``run_with`` the jobs run here (management command), reporting progress
    per session; otherwise they are queued.
    """
    if session_id is not None:
        validate_session_id(session_id)
        _require_session(memory_base, session_id)
    _discover_sessions(memory_base)
    scope = memory_base.sessions.order_by("session_id")
    if session_id is not None:
        scope = scope.filter(session_id=session_id)
    sessions = list(scope)
    for session in sessions:
        active = session_active_job(session=session)
        if active is not None:
            raise JobConflict(active)
    kb = memory_base.knowledge_base
    with transaction.atomic():
        MemoryBaseSession.objects.filter(pk__in=[s.pk for s in sessions]).update(
            cursor_message_id=None, cursor_created_at=None, total_processed=0
        )
    if session_id is None:
        knowledge_base_delete_chunks(knowledge_base=kb)
    else:
        knowledge_base_delete_chunks(knowledge_base=kb, session_id=session_id)
    # A mismatch means rows vanished behind our back: the counters are stale too.
    knowledge_base_recount(knowledge_base=kb)
    jobs = []
    for session in sessions:
        session.refresh_from_db()
        callback = (lambda d, t, s=session.session_id: progress(s, d, t)) if progress else None
        job = session_ingest_enqueue(
            session=session,
            trigger=MemoryBaseJob.Trigger.REGENERATE,
            run_with=run_with,
            progress=callback,
        )
        if job is not None:
            jobs.append(job)
    return jobs


def session_messages_delete(*, flow: Flow, session_id: str) -> int:
    """Delete a session: its messages, its running summary and its node memory
    (``sessions_erase``: nothing of it reaches a prompt again, and the id starts afresh),
    after purging that session's chunks from every memory base of the flow
    (``session_chunks_delete``). The erasure is recorded in the audit trail of access
    (the count, not the session's id), in the transaction that deletes the messages:
    they go with their record or not at all."""
    session_chunks_delete(flow=flow, session_id=session_id)
    with transaction.atomic():
        deleted = sessions_erase(flow=flow, session_ids=[session_id])
        access_record(owner_id=flow.owner_id, action="erasure",
                      detail={"scope_kind": "session", "counts": {"messages": deleted}})  # fmt: skip
    return deleted


def session_chunks_delete(*, flow: Flow, session_id: str) -> None:
    """Purge a session's chunks from every memory base of the flow (cancelling their
    jobs for the session first) and forget the session there; its messages stay."""
    validate_session_id(session_id)
    for memory_base in MemoryBase.objects.filter(flow=flow).select_related("knowledge_base"):
        memory_base_cancel_jobs(memory_base=memory_base, session_id=session_id)
        knowledge_base_delete_chunks(
            knowledge_base=memory_base.knowledge_base, session_id=session_id
        )
        memory_base.sessions.filter(session_id=session_id).delete()
