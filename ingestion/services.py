"""Memory Bases: capture flow runs, trigger per-session ingestion, run it exactly once.

Invariants:
- One active job per (memory base, session): a partial unique index on
  IngestionJob; a second trigger gets ``JobConflict`` naming the active job.
- The cursor moves only after the chunks of the messages it passes are committed
  (``knowledge_base_ingest`` returns after its commit; the cursor update is a
  separate, later transaction). Chunk source keys derive from message ids, so a
  crash between the two makes the next run rewrite the same rows, not duplicates.
- A job's scope (start cursor, last message) is fixed when it is queued.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from core.db import advisory_xact_lock
from core.providers.llm import get_llm
from ingestion.models import (
    SESSION_ID_PATTERN,
    Flow,
    IngestionJob,
    MemoryBase,
    MemoryBaseSession,
    Message,
)
from knowledge.models import Chunk
from knowledge.services import (
    DocumentIn,
    IngestCancelled,
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_delete_chunks,
    knowledge_base_ingest,
    knowledge_base_recount,
)
from knowledge.services import NameTaken as KnowledgeNameTaken

logger = logging.getLogger(__name__)
_SESSION_RE = re.compile(SESSION_ID_PATTERN)
INGEST_BATCH_MESSAGES = 200


class IngestionError(Exception):
    code = "invalid"


class NameTaken(IngestionError):
    code = "name_taken"


class JobConflict(IngestionError):
    code = "conflict"

    def __init__(self, job: IngestionJob):
        self.job = job
        super().__init__(
            f"session {job.session.session_id!r} already has an active ingestion job {job.id} "
            f"({job.status})"
        )


@dataclass(frozen=True)
class MessageIn:
    role: str
    text: str
    content: list[dict[str, Any]] = field(default_factory=list)
    is_output: bool | None = None
    sender: str = ""
    sender_name: str = ""
    files: list[dict[str, Any]] = field(default_factory=list)
    parent_id: int | None = None

    def output(self) -> bool:
        # A message without an explicit flag is an output unless the user wrote it.
        return self.is_output if self.is_output is not None else self.role != "user"


def validate_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not _SESSION_RE.match(session_id):
        raise IngestionError(
            "session_id must be 1-255 characters: letters, digits and . _ : @ / + = -, "
            "starting with a letter or digit"
        )
    return session_id


# --- flows --------------------------------------------------------------------------
def flow_create(*, owner: AbstractBaseUser, name: str) -> Flow:
    """Register a flow; names are unique per owner."""
    try:
        with transaction.atomic():
            return Flow.objects.create(owner=owner, name=name)
    except IntegrityError as exc:
        raise NameTaken(f"a flow named {name!r} already exists") from exc


# --- capture ------------------------------------------------------------------------
def _session_lock(flow: Flow, session_id: str) -> None:
    """Serialise captures of one (flow, session) until the transaction ends.

    With the lock held, ``created_at`` is read from the database clock, so within a
    session the keyset (created_at, id) grows in commit order and a cursor can
    never pass a message that commits later.
    """
    advisory_xact_lock(f"{flow.pk}:{session_id}")


def _db_now() -> datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def messages_record(
    *, flow: Flow, session_id: str, run_id: str, messages: Sequence[MessageIn]
) -> list[Message]:
    """Store one run's messages and trigger ingestion where a threshold is reached.

    The messages are committed whatever happens to the trigger: for each
    auto-capture memory base of the flow the session row is ensured and, if the
    pending outputs reach the threshold, a job is queued after the commit; a
    failure to queue is logged and retried at the next trigger.
    """
    validate_session_id(session_id)
    if not messages:
        raise IngestionError("a run needs at least one message")
    parent_ids = {m.parent_id for m in messages if m.parent_id is not None}
    with transaction.atomic():
        _session_lock(flow, session_id)
        if parent_ids:
            known = set(
                Message.objects.filter(
                    flow=flow, session_id=session_id, pk__in=parent_ids
                ).values_list("pk", flat=True)
            )
            if known != parent_ids:
                raise IngestionError(
                    f"parent message(s) {sorted(parent_ids - known)} are not in this session"
                )
        now = _db_now()
        stored = Message.objects.bulk_create(
            [
                Message(
                    owner_id=flow.owner_id, flow=flow, session_id=session_id, run_id=run_id,
                    is_output=m.output(), role=m.role, sender=m.sender or m.role,
                    sender_name=m.sender_name, text=m.text, content=m.content, files=m.files,
                    parent_id=m.parent_id, created_at=now,
                )
                for m in messages
            ]
        )  # fmt: skip
        for session in _sessions_to_trigger(flow, session_id):
            transaction.on_commit(lambda s=session: _enqueue_quietly(s), robust=True)
    return stored


def _sessions_to_trigger(flow: Flow, session_id: str) -> list[MemoryBaseSession]:
    due = []
    for memory_base in MemoryBase.objects.filter(flow=flow, auto_capture=True):
        session = memory_base_session_ensure(memory_base=memory_base, session_id=session_id)
        session.memory_base = memory_base  # already loaded: no query per trigger check
        if session_pending_count(session=session) >= memory_base.threshold:
            due.append(session)
    return due


def _enqueue_quietly(session: MemoryBaseSession) -> None:
    try:
        session_ingest_enqueue(session=session, trigger=IngestionJob.Trigger.AUTO)
    except JobConflict as exc:
        logger.info("auto-trigger skipped: %s", exc)
    except Exception:  # noqa: BLE001 - the run is stored; the next trigger retries
        logger.exception("could not queue ingestion for session %s", session.pk)


def memory_base_session_ensure(*, memory_base: MemoryBase, session_id: str) -> MemoryBaseSession:
    """The session row, created if missing (safe under concurrent callers)."""
    session, _ = MemoryBaseSession.objects.get_or_create(
        memory_base=memory_base, session_id=session_id
    )
    return session


def _outputs_after_cursor(session: MemoryBaseSession) -> QuerySet[Message]:
    qs = Message.objects.filter(
        flow_id=session.memory_base.flow_id, session_id=session.session_id, is_output=True
    )
    if session.cursor_message_id is not None:
        qs = qs.filter(_after(session.cursor_created_at, session.cursor_message_id))
    return qs


def _after(created_at: datetime | None, message_id: int | None) -> Q:
    """Messages after the keyset cursor (created_at, id).

    The redundant ``created_at >= cursor`` lets PostgreSQL bound the index range
    with the cursor; the OR alone is applied as a filter over the whole session.
    """
    if message_id is None:
        return Q()
    return Q(created_at__gte=created_at) & (
        Q(created_at__gt=created_at) | Q(created_at=created_at, id__gt=message_id)
    )


def session_pending_count(*, session: MemoryBaseSession) -> int:
    return _outputs_after_cursor(session).count()


# --- jobs ---------------------------------------------------------------------------
def session_ingest_enqueue(
    *,
    session: MemoryBaseSession,
    trigger: str,
    run_inline: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> IngestionJob | None:
    """Queue an ingestion job for everything pending in ``session`` now.

    Returns None when nothing is pending. Raises ``JobConflict`` when the session
    already has an active job (the database refuses a second one). The task is
    handed to django-q2 after the job row commits; with ``run_inline`` it runs
    in this process instead (management commands).
    """
    last = _outputs_after_cursor(session).order_by("-created_at", "-id").first()
    if last is None:
        return None
    try:
        with transaction.atomic():
            job = IngestionJob.objects.create(
                memory_base_id=session.memory_base_id, session=session, trigger=trigger,
                start_cursor_message_id=session.cursor_message_id,
                start_cursor_created_at=session.cursor_created_at,
                last_message_id=last.pk, last_message_created_at=last.created_at,
            )  # fmt: skip
    except IntegrityError as exc:
        active = session_active_job(session=session)
        if active is None:  # finished in between: let the caller try again
            raise IngestionError("the previous job just finished; try again") from exc
        raise JobConflict(active) from exc
    if run_inline:
        session_ingest_run(job_id=job.pk, progress=progress)
        job.refresh_from_db()
    else:
        # robust: the job row is committed; a failed hand-off (the database gone in
        # between) must not turn the accepted request into an error.
        transaction.on_commit(lambda: _dispatch(job), robust=True)
    return job


def _dispatch(job: IngestionJob) -> None:
    from django_q.tasks import async_task

    try:
        task_id = async_task(
            "ingestion.tasks.ingest_session", str(job.pk), task_name=f"ingest-{job.pk}"
        )
    except Exception as exc:
        # Free the session's slot, or it would stay blocked by a job nobody runs.
        IngestionJob.objects.filter(pk=job.pk, status=IngestionJob.Status.QUEUED).update(
            status=IngestionJob.Status.FAILED, error=f"could not queue: {exc}",
            finished_at=timezone.now(),
        )  # fmt: skip
        raise
    IngestionJob.objects.filter(pk=job.pk).update(task_id=str(task_id or ""))


def session_active_job(*, session: MemoryBaseSession) -> IngestionJob | None:
    return (
        IngestionJob.objects.select_related("session")
        .filter(session=session, status__in=IngestionJob.ACTIVE)
        .first()
    )


def _claim(job_id: Any) -> IngestionJob | None:
    """Mark the job running; None if it is gone, finished or cancelled.

    A job found already running is taken over: delivery is at least once, and a
    worker that died mid-run left it so. The run is idempotent.
    """
    with transaction.atomic():
        job = (
            IngestionJob.objects.select_for_update()
            .select_related("session", "memory_base__knowledge_base", "memory_base__flow")
            .filter(pk=job_id)
            .first()
        )
        if job is None or job.status not in IngestionJob.ACTIVE:
            return None
        if job.cancel_requested:
            _finish(job, IngestionJob.Status.CANCELLED)
            return None
        job.status = IngestionJob.Status.RUNNING
        job.started_at = job.started_at or timezone.now()
        job.save(update_fields=["status", "started_at"])
        return job


def _finish(job: IngestionJob, status: str, error: str = "") -> None:
    job.status, job.error, job.finished_at = status, error[:5000], timezone.now()
    IngestionJob.objects.filter(pk=job.pk).update(
        status=job.status, error=job.error, finished_at=job.finished_at
    )


def _cancelled(job_id: Any) -> bool:
    state = (
        IngestionJob.objects.filter(pk=job_id).values_list("cancel_requested", flat=True).first()
    )
    return state is None or bool(state)  # a deleted job counts as cancelled


def _batch_to_documents(memory_base: MemoryBase, batch: list[Message]) -> list[DocumentIn]:
    if memory_base.preprocess:
        return _preprocess(memory_base, batch)
    return [
        DocumentIn(
            text=m.text,
            source_key=f"message:{m.pk}",
            metadata={
                "message_id": str(m.pk),
                "session_id": m.session_id,
                "flow_id": str(m.flow_id),
                "run_id": m.run_id,
                "sender": m.sender,
                "timestamp": m.created_at,
                "source_type": "message",
                "role": m.role,
            },
        )  # fmt: skip
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
            metadata={
                "session_id": first.session_id,
                "flow_id": str(first.flow_id),
                "run_id": last.run_id,
                "timestamp": last.created_at,
                "source_type": "memory_summary",
                "first_message_id": first.pk,
                "last_message_id": last.pk,
            },
        )  # fmt: skip
    ]


def _advance_cursor(session: MemoryBaseSession, last: Message, count: int) -> None:
    """Move the cursor past ``last``; never backwards (a stale rerun cannot rewind it)."""
    with transaction.atomic():
        fresh = MemoryBaseSession.objects.select_for_update().get(pk=session.pk)
        behind = fresh.cursor_message_id is None or (fresh.cursor_created_at, fresh.cursor_message_id) < (
            last.created_at, last.pk,
        )  # fmt: skip
        if behind:
            fresh.cursor_message_id, fresh.cursor_created_at = last.pk, last.created_at
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
        session.cursor_message_id, session.cursor_created_at = (
            fresh.cursor_message_id,
            fresh.cursor_created_at,
        )


def session_ingest_run(
    *, job_id: Any, progress: Callable[[int, int], None] | None = None
) -> IngestionJob | None:
    """Run one queued job: ingest its scope in batches, advancing the cursor after each.

    Starts from the later of the job's start cursor and the session's cursor (a
    rerun after a crash resumes, it does not redo). Checks for cancellation
    between batches. On failure the job is marked failed and the cursor stays at
    the last committed batch, so the next run resumes from there.
    """
    job = _claim(job_id)
    if job is None:
        return None
    session = MemoryBaseSession.objects.select_related("memory_base__knowledge_base").get(
        pk=job.session_id
    )
    memory_base, kb = session.memory_base, session.memory_base.knowledge_base
    scope = Message.objects.filter(
        flow_id=memory_base.flow_id, session_id=session.session_id, is_output=True
    ).exclude(_after(job.last_message_created_at, job.last_message_id))
    total = _scope_count(session, job)
    done = 0
    try:
        while True:
            if _cancelled(job.pk):
                _finish(job, IngestionJob.Status.CANCELLED)
                return job
            batch = list(
                scope.filter(_after(session.cursor_created_at, session.cursor_message_id)).order_by(
                    "created_at", "id"
                )[:INGEST_BATCH_MESSAGES]
            )
            if not batch:
                break
            documents = _batch_to_documents(memory_base, batch)
            if documents:
                result = knowledge_base_ingest(
                    knowledge_base=kb, documents=documents, should_cancel=lambda: _cancelled(job.pk)
                )
                IngestionJob.objects.filter(pk=job.pk).update(
                    chunks_written=F("chunks_written") + result.chunks_written
                )
            _advance_cursor(session, batch[-1], len(batch))
            done += len(batch)
            IngestionJob.objects.filter(pk=job.pk).update(messages_processed=done)
            if progress:
                progress(done, total)
    except IngestCancelled:
        _finish(job, IngestionJob.Status.CANCELLED)
        return job
    except Exception as exc:
        logger.exception("ingestion job %s failed", job.pk)
        _finish(job, IngestionJob.Status.FAILED, f"{type(exc).__name__}: {exc}")
        return job
    _finish(job, IngestionJob.Status.SUCCEEDED)
    return job


def _scope_count(session: MemoryBaseSession, job: IngestionJob) -> int:
    return (
        Message.objects.filter(
            flow_id=session.memory_base.flow_id, session_id=session.session_id, is_output=True
        )
        .filter(_after(session.cursor_created_at, session.cursor_message_id))
        .exclude(_after(job.last_message_created_at, job.last_message_id))
        .count()
    )


# --- memory bases -------------------------------------------------------------------
def memory_base_create(
    *,
    owner: AbstractBaseUser,
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
    if threshold < 1:
        raise IngestionError("threshold must be at least 1")
    if flow.owner_id != owner.pk:
        raise IngestionError("unknown flow")
    kb_name = kb_name or f"Memory: {name}"
    with transaction.atomic():
        if MemoryBase.objects.filter(owner=owner, name=name).exists():
            raise NameTaken(f"a memory base named {name!r} already exists")
        try:
            kb = knowledge_base_create(owner=owner, name=kb_name, is_memory_base=True)
        except KnowledgeNameTaken as exc:
            raise NameTaken(f"a knowledge base named {kb_name!r} already exists") from exc
        try:
            with transaction.atomic():
                return MemoryBase.objects.create(
                    owner=owner, name=name, flow=flow, threshold=threshold, knowledge_base=kb,
                    kb_name=kb_name, auto_capture=auto_capture, preprocess=preprocess,
                    preprocess_model=preprocess_model, preprocess_instructions=preprocess_instructions,
                    preprocess_kill_phrase=preprocess_kill_phrase,
                )  # fmt: skip
        except IntegrityError as exc:
            raise NameTaken(f"a memory base named {name!r} already exists") from exc


UPDATABLE = (
    "name", "threshold", "auto_capture", "preprocess", "preprocess_model",
    "preprocess_instructions", "preprocess_kill_phrase",
)  # fmt: skip


def memory_base_update(*, memory_base: MemoryBase, **changes: Any) -> MemoryBase:
    """Change settings. A new threshold counts from the next trigger; queued and
    running jobs keep the scope they were given."""
    unknown = set(changes) - set(UPDATABLE)
    if unknown:
        raise IngestionError(f"cannot change {', '.join(sorted(unknown))}")
    if "threshold" in changes and changes["threshold"] < 1:
        raise IngestionError("threshold must be at least 1")
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
    jobs = IngestionJob.objects.filter(memory_base=memory_base, status__in=IngestionJob.ACTIVE)
    if session_id is not None:
        jobs = jobs.filter(session__session_id=session_id)
    count = jobs.update(cancel_requested=True)
    IngestionJob.objects.filter(pk__in=jobs.values("pk"), status=IngestionJob.Status.QUEUED).update(
        status=IngestionJob.Status.CANCELLED, finished_at=timezone.now()
    )
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
        if not IngestionJob.objects.filter(
            memory_base=memory_base, status=IngestionJob.Status.RUNNING
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
    trigger: str = IngestionJob.Trigger.MANUAL,
) -> list[IngestionJob]:
    """Queue ingestion for every session with pending outputs (or one), ignoring the
    threshold. Raises ``JobConflict`` if a targeted session already has an active job;
    then nothing is queued."""
    if session_id is not None:
        validate_session_id(session_id)
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


def _discover_sessions(memory_base: MemoryBase) -> None:
    """Sessions of the flow that have outputs but no session row yet (e.g. messages
    captured before the memory base existed)."""
    known = set(memory_base.sessions.values_list("session_id", flat=True))
    found = (
        Message.objects.filter(flow_id=memory_base.flow_id, is_output=True)
        .values_list("session_id", flat=True)
        .distinct()
    )
    for session_id in set(found) - known:
        memory_base_session_ensure(memory_base=memory_base, session_id=session_id)


def memory_base_mismatch(*, memory_base: MemoryBase) -> bool:
    """True when sessions claim processed messages but the knowledge base holds no
    chunks (deleted behind our back)."""
    processed = memory_base.sessions.filter(total_processed__gt=0).exists()
    return (
        processed
        and not Chunk.objects.filter(knowledge_base_id=memory_base.knowledge_base_id).exists()
    )


def memory_base_regenerate(
    *,
    memory_base: MemoryBase,
    session_id: str | None = None,
    run_inline: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[IngestionJob]:
    """Reset cursors, clear the stored chunks and re-ingest from the start.

    For all sessions, or one. Refuses with ``JobConflict`` while a job is active.
    With ``run_inline`` the jobs run here (management command), reporting progress
    per session; otherwise they are queued.
    """
    _discover_sessions(memory_base)
    sessions = memory_base.sessions.order_by("session_id")
    if session_id is not None:
        sessions = sessions.filter(session_id=session_id)
    sessions = list(sessions)
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
            trigger=IngestionJob.Trigger.REGENERATE,
            run_inline=run_inline,
            progress=callback,
        )
        if job is not None:
            jobs.append(job)
    return jobs


def session_messages_delete(*, flow: Flow, session_id: str) -> int:
    """Delete a session's messages and purge that session's chunks from every
    memory base of the flow (cancelling their jobs for the session first)."""
    validate_session_id(session_id)
    for memory_base in MemoryBase.objects.filter(flow=flow).select_related("knowledge_base"):
        memory_base_cancel_jobs(memory_base=memory_base, session_id=session_id)
        knowledge_base_delete_chunks(
            knowledge_base=memory_base.knowledge_base, session_id=session_id
        )
        memory_base.sessions.filter(session_id=session_id).delete()
    deleted, _ = Message.objects.filter(flow=flow, session_id=session_id).delete()
    return deleted
