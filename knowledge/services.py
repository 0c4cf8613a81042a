"""Writes for knowledge bases: create, update, delete, and the ingestion helper."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from core.db import advisory_session_lock, try_advisory_xact_lock
from core.db_recovery import refresh_after_commit
from core.providers.embeddings import Embedder, EmbeddingConfig, embedder_for
from knowledge.chunking import chunk_text
from knowledge.models import FTS_LANGUAGES, INDEXED_DIMENSIONS, IngestJob, KnowledgeBase

logger = logging.getLogger(__name__)

INGEST_JOB_MAX_ATTEMPTS = 3
MESSAGE_CHUNKING = (1000, 100)
FILE_CHUNKING = (500, 50)
# Metadata keys stored in their own (indexed, filterable) columns; anything else
# stays in the chunk's JSON metadata.
COLUMN_KEYS = (
    "message_id",
    "session_id",
    "flow_id",
    "run_id",
    "sender",
    "source_type",
    "file_path",
    "content_hash",
)


class KnowledgeError(Exception):
    code = "invalid"


class NameTaken(KnowledgeError):
    code = "name_taken"


class ReadOnlyKnowledgeBase(KnowledgeError):
    code = "read_only"


class IngestCancelled(KnowledgeError):
    code = "cancelled"


@dataclass(frozen=True)
class DocumentIn:
    text: str
    source_key: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class IngestResult:
    documents: int
    chunks_written: int
    chunks_deleted: int


@dataclass(frozen=True)
class IndexRun:
    indexed: int
    finished: bool  # no pending rows were left
    busy: bool  # another indexer held the lock, or another transaction the rows


@dataclass
class _ChunkRow:
    document_key: str
    source_key: str
    text: str
    index: int
    total: int
    metadata: Mapping[str, Any]


def kb_embedding_config(kb: KnowledgeBase) -> EmbeddingConfig:
    return EmbeddingConfig(
        provider=kb.embedding_provider,
        model=kb.embedding_model,
        dimensions=kb.embedding_dimensions,
    )


def kb_embedder(kb: KnowledgeBase) -> Embedder:
    return embedder_for(kb_embedding_config(kb))


# --- knowledge bases ----------------------------------------------------------------
def knowledge_base_create(
    *,
    owner: AbstractBaseUser,
    name: str,
    description: str = "",
    is_memory_base: bool = False,
    source_kind: str = KnowledgeBase.SourceKind.DOCUMENTS,
    language: str = "english",
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
) -> KnowledgeBase:
    """Create a base whose embedding provider, model and dimension are fixed now.

    The configured provider at creation time is recorded; later searches and
    ingestion always embed with it. Raises ``NameTaken`` if the owner already has
    a base with this name (the database enforces it).
    """
    if language not in FTS_LANGUAGES:
        raise KnowledgeError(f"language must be one of {', '.join(FTS_LANGUAGES)}")
    default_size, default_overlap = (
        FILE_CHUNKING if source_kind == KnowledgeBase.SourceKind.FILES else MESSAGE_CHUNKING
    )
    config = EmbeddingConfig.from_settings()
    try:
        with transaction.atomic():
            return KnowledgeBase.objects.create(
                owner=owner,
                name=name,
                description=description,
                embedding_provider=config.provider,
                embedding_model=config.model,
                embedding_dimensions=config.dimensions,
                is_memory_base=is_memory_base,
                source_kind=source_kind,
                language=language,
                chunk_size=chunk_size or default_size,
                chunk_overlap=default_overlap if chunk_overlap is None else chunk_overlap,
            )
    except IntegrityError as exc:
        if "kb_unique_name_per_owner" in str(exc):
            raise NameTaken(f"a knowledge base named {name!r} already exists") from exc
        raise


def knowledge_base_update(
    *, knowledge_base: KnowledgeBase, name: str | None = None, description: str | None = None
) -> KnowledgeBase:
    """Rename or re-describe a base. Embedding settings never change after creation."""
    if name is not None:
        knowledge_base.name = name
    if description is not None:
        knowledge_base.description = description
    try:
        with transaction.atomic():
            knowledge_base.save(update_fields=["name", "description", "updated_at"])
    except IntegrityError as exc:
        raise NameTaken(f"a knowledge base named {name!r} already exists") from exc
    return knowledge_base


def knowledge_base_delete(*, knowledge_base: KnowledgeBase) -> None:
    """Delete a base and all its chunks (one statement, cascaded by the database)."""
    # Chunks have no dependents, so Django deletes them with one DELETE ... WHERE
    # knowledge_base_id = ..., without loading them.
    with transaction.atomic():
        knowledge_base.delete()


# --- ingestion ----------------------------------------------------------------------
def _chunk_documents(kb: KnowledgeBase, documents: Sequence[DocumentIn]) -> list[_ChunkRow]:
    rows: list[_ChunkRow] = []
    for doc in documents:
        pieces = chunk_text(doc.text, size=kb.chunk_size, overlap=kb.chunk_overlap)
        for index, piece in enumerate(pieces):
            rows.append(
                _ChunkRow(
                    document_key=doc.source_key,
                    source_key=f"{doc.source_key}#{index}",
                    text=piece,
                    index=index,
                    total=len(pieces),
                    metadata=doc.metadata,
                )
            )
    return rows


def _timestamp(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    parsed = parse_datetime(str(value))
    if parsed is None:
        raise KnowledgeError(f"metadata timestamp {value!r} is not an ISO 8601 date-time")
    return parsed


_registered: weakref.WeakSet[Any] = weakref.WeakSet()


def _raw_connection() -> Any:
    connection.ensure_connection()
    raw = connection.connection
    if raw not in _registered:
        register_vector(raw)
        _registered.add(raw)
    return raw


_STAGE_COLUMNS = (
    "source_key text, document_key text, text text, embedding vector, fts_config text, "
    "chunk_index int4, chunk_total int4, source_type text, message_id text, session_id text, "
    "flow_id text, run_id text, sender text, file_path text, content_hash text, "
    "source_timestamp timestamptz, metadata jsonb, word_count int4"
)
_STAGE_TYPES = [
    "text", "text", "text", "vector", "text", "int4", "int4", "text", "text", "text",
    "text", "text", "text", "text", "text", "timestamptz", "jsonb", "int4",
]  # fmt: skip
_COPY_NAMES = (
    "source_key, document_key, text, embedding, fts_config, chunk_index, chunk_total, "
    "source_type, message_id, session_id, flow_id, run_id, sender, file_path, content_hash, "
    "source_timestamp, metadata, word_count"
)
_UPSERT_SQL = f"""
INSERT INTO knowledge_chunk (knowledge_base_id, dimensions, index_pending, created_at, updated_at,
                             {_COPY_NAMES})
SELECT %(kb)s, %(dims)s, %(pending)s, now(), now(), source_key, document_key, text, embedding,
       fts_config::regconfig, chunk_index, chunk_total, source_type, message_id, session_id,
       flow_id, run_id, sender, file_path, content_hash, coalesce(source_timestamp, now()),
       metadata, word_count
FROM knowledge_chunk_stage
ON CONFLICT (knowledge_base_id, source_key) DO UPDATE SET
    document_key = EXCLUDED.document_key, text = EXCLUDED.text,
    embedding = EXCLUDED.embedding, dimensions = EXCLUDED.dimensions,
    index_pending = EXCLUDED.index_pending,
    fts_config = EXCLUDED.fts_config, chunk_index = EXCLUDED.chunk_index,
    chunk_total = EXCLUDED.chunk_total, source_type = EXCLUDED.source_type,
    message_id = EXCLUDED.message_id, session_id = EXCLUDED.session_id,
    flow_id = EXCLUDED.flow_id, run_id = EXCLUDED.run_id, sender = EXCLUDED.sender,
    file_path = EXCLUDED.file_path, content_hash = EXCLUDED.content_hash,
    source_timestamp = EXCLUDED.source_timestamp, metadata = EXCLUDED.metadata,
    word_count = EXCLUDED.word_count, updated_at = now()
"""
_AGGREGATE = (
    "count(*), coalesce(sum(word_count), 0), coalesce(sum(char_length(text)), 0), "
    "coalesce(sum(octet_length(text)), 0)"
)


def _stage_row(kb: KnowledgeBase, row: _ChunkRow, vector: Any) -> tuple[Any, ...]:
    meta = dict(row.metadata)
    columns = {key: str(meta.pop(key, "") or "") for key in COLUMN_KEYS}
    timestamp = _timestamp(meta.pop("timestamp", None))
    return (
        row.source_key, row.document_key, row.text, vector, kb.language, row.index, row.total,
        columns["source_type"], columns["message_id"], columns["session_id"],
        columns["flow_id"], columns["run_id"], columns["sender"], columns["file_path"],
        columns["content_hash"], timestamp, Jsonb(meta), len(row.text.split()),
    )  # fmt: skip


def _write_chunks(
    kb: KnowledgeBase, stage_rows: list[tuple[Any, ...]], doc_keys: list[str]
) -> tuple[int, int]:
    """Inside a transaction: replace the chunks of ``doc_keys`` with ``stage_rows``."""
    raw = _raw_connection()
    with raw.cursor() as cur:
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS knowledge_chunk_stage ({_STAGE_COLUMNS}) "
            "ON COMMIT DELETE ROWS"
        )
        cur.execute("TRUNCATE knowledge_chunk_stage")
        old = cur.execute(
            f"SELECT {_AGGREGATE} FROM knowledge_chunk "
            "WHERE knowledge_base_id = %s AND document_key = ANY(%s)",
            (kb.pk, doc_keys),
        ).fetchone()
        with cur.copy(
            f"COPY knowledge_chunk_stage ({_COPY_NAMES}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(_STAGE_TYPES)
            for values in stage_rows:
                copy.write_row(values)
        # Chunks of re-ingested documents that the new version no longer has.
        cur.execute(
            "DELETE FROM knowledge_chunk c WHERE c.knowledge_base_id = %s "
            "AND c.document_key = ANY(%s) AND NOT EXISTS "
            "(SELECT 1 FROM knowledge_chunk_stage s WHERE s.source_key = c.source_key)",
            (kb.pk, doc_keys),
        )
        deleted = cur.rowcount
        cur.execute(
            _UPSERT_SQL,
            {"kb": kb.pk, "dims": kb.embedding_dimensions, "pending": _defer_indexing(kb)},
        )
        new = cur.execute(f"SELECT {_AGGREGATE} FROM knowledge_chunk_stage").fetchone()
        _apply_stats_delta(cur, kb, old, new)
    return len(stage_rows), deleted


def _defer_indexing(kb: KnowledgeBase) -> bool:
    return settings.KNOWLEDGE_DEFERRED_INDEXING and kb.embedding_dimensions in INDEXED_DIMENSIONS


def _apply_stats_delta(cur: Any, kb: KnowledgeBase, old: tuple, new: tuple) -> None:
    cur.execute(
        "UPDATE knowledge_knowledgebase SET chunk_count = chunk_count - %s + %s, "
        "word_count = word_count - %s + %s, char_count = char_count - %s + %s, "
        "size_bytes = size_bytes - %s + %s, updated_at = now(), source_types = coalesce(("
        "  SELECT jsonb_agg(t ORDER BY t) FROM (SELECT DISTINCT source_type t FROM "
        "  knowledge_chunk WHERE knowledge_base_id = %s AND source_type <> '') d), '[]') "
        "WHERE id = %s",
        (old[0], new[0], old[1], new[1], old[2], new[2], old[3], new[3], kb.pk, kb.pk),
    )


def knowledge_base_ingest(
    *,
    knowledge_base: KnowledgeBase,
    documents: Sequence[DocumentIn],
    should_cancel: Callable[[], bool] | None = None,
    embed_batch_size: int = 256,
) -> IngestResult:
    """Chunk, embed and store ``documents``; return only after the write is committed.

    Embedding happens first, in batches, outside any transaction (network calls
    must not hold locks). Then every chunk is written in one transaction: a
    failure leaves nothing partial visible. Source keys are deterministic
    (``<document source_key>#<chunk index>``), so re-ingesting a document updates
    its chunks in place and drops the ones it no longer has; a retry of the same
    batch yields the same rows. ``should_cancel`` is checked between embedding
    batches and raises ``IngestCancelled`` before anything is written.
    """
    keys = _check_batch(documents)
    rows = _chunk_documents(knowledge_base, documents)
    embedder = kb_embedder(knowledge_base)
    vectors: list[Any] = []
    for start in range(0, len(rows), embed_batch_size):
        if should_cancel is not None and should_cancel():
            raise IngestCancelled("ingestion cancelled")
        batch = rows[start : start + embed_batch_size]
        vectors.extend(embedder.embed([row.text for row in batch]))
    if should_cancel is not None and should_cancel():
        raise IngestCancelled("ingestion cancelled")
    stage_rows = [_stage_row(knowledge_base, row, vec) for row, vec in zip(rows, vectors)]
    with transaction.atomic():
        # The row lock serialises writers of one base, so the counters stay exact;
        # it also fails cleanly if the base was deleted meanwhile.
        KnowledgeBase.objects.select_for_update().get(pk=knowledge_base.pk)
        written, deleted = _write_chunks(knowledge_base, stage_rows, keys)
        if written and _defer_indexing(knowledge_base):
            transaction.on_commit(enqueue_chunk_indexing, robust=True)
    refresh_after_commit(knowledge_base)
    return IngestResult(documents=len(documents), chunks_written=written, chunks_deleted=deleted)


def _check_batch(documents: Sequence[DocumentIn]) -> list[str]:
    keys = [doc.source_key for doc in documents]
    if len(set(keys)) != len(keys):
        raise KnowledgeError("source_key values must be unique within a batch")
    return keys


def knowledge_ingest_job_create(
    *, knowledge_base: KnowledgeBase, documents: Sequence[DocumentIn]
) -> IngestJob:
    """Store a batch for background ingestion and queue it once committed.

    The batch is checked as the synchronous path would check it, so a bad one is
    refused here (KnowledgeError) instead of failing later in its job.
    """
    _check_batch(documents)
    for document in documents:
        _timestamp(document.metadata.get("timestamp"))
    with transaction.atomic():
        job = IngestJob.objects.create(
            knowledge_base=knowledge_base,
            documents=[
                {"text": d.text, "source_key": d.source_key, "metadata": dict(d.metadata)}
                for d in documents
            ],
            document_count=len(documents),
            char_count=sum(len(d.text) for d in documents),
        )
        transaction.on_commit(lambda: _enqueue_ingest_job(job), robust=True)
    return job


def _enqueue_ingest_job(job: IngestJob) -> None:
    from django_q.tasks import async_task

    try:
        async_task("knowledge.tasks.run_ingest_job", str(job.pk), task_name="ingest-documents")
    except Exception as exc:
        logger.exception("could not queue ingest job %s", job.pk)
        IngestJob.objects.filter(pk=job.pk, status=IngestJob.Status.QUEUED).update(
            status=IngestJob.Status.FAILED,
            error=f"could not be queued: {type(exc).__name__}: {exc}",
            finished_at=timezone.now(),
        )


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
    if knowledge_base.source_kind == KnowledgeBase.SourceKind.FILES:
        raise ReadOnlyKnowledgeBase("this knowledge base indexes files and is read-only here")
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
    waiting = (
        IngestJob.objects.filter(knowledge_base=knowledge_base, status__in=IngestJob.ACTIVE)
        .defer("documents")
        .first()
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


def _finish_job(job_pk: Any, **fields: Any) -> None:
    IngestJob.objects.filter(pk=job_pk).update(finished_at=timezone.now(), **fields)


def _run_job(job_pk: Any) -> None:
    with transaction.atomic():
        job = IngestJob.objects.select_for_update().select_related("knowledge_base").get(pk=job_pk)
        if job.attempts >= INGEST_JOB_MAX_ATTEMPTS:
            _finish_job(
                job.pk,
                status=IngestJob.Status.FAILED,
                error=f"interrupted {job.attempts} times (worker timeout or restart); "
                "send the batch again in smaller parts",
            )
            return
        job.status, job.started_at = IngestJob.Status.RUNNING, timezone.now()
        job.attempts += 1
        job.save(update_fields=["status", "started_at", "attempts"])
    documents = [
        DocumentIn(text=d["text"], source_key=d["source_key"], metadata=d.get("metadata") or {})
        for d in job.documents
    ]
    try:
        result = knowledge_base_ingest(knowledge_base=job.knowledge_base, documents=documents)
    except Exception as exc:  # recorded on the job: its poller must learn what happened
        logger.exception("ingest job %s failed", job.pk)
        message = str(exc) if isinstance(exc, KnowledgeError) else f"{type(exc).__name__}: {exc}"
        _finish_job(job.pk, status=IngestJob.Status.FAILED, error=message[:2000])
    except BaseException as exc:
        # The task's time limit (django-q raises a SystemExit subclass) or a shutdown.
        _finish_job(
            job.pk,
            status=IngestJob.Status.FAILED,
            error=f"interrupted: {type(exc).__name__}; send the batch again in smaller parts",
        )
        raise
    else:
        _finish_job(
            job.pk,
            status=IngestJob.Status.SUCCEEDED,
            chunks_written=result.chunks_written,
            chunks_deleted=result.chunks_deleted,
            documents=[],
            error="",
        )


def knowledge_ingest_jobs_sweep(*, stale_seconds: float | None = None) -> int:
    """Resume bases whose jobs wait with nobody running them (a lost task, a worker
    killed mid-run). Bases with a live runner are skipped by its lock."""
    stale = settings.Q_CLUSTER["retry"] if stale_seconds is None else stale_seconds
    cutoff = timezone.now() - timedelta(seconds=stale)
    bases = (
        IngestJob.objects.filter(status__in=IngestJob.ACTIVE)
        .filter(Q(started_at__lt=cutoff) | Q(started_at__isnull=True, created_at__lt=cutoff))
        .values_list("knowledge_base_id", flat=True)
        .distinct()
    )
    return sum(knowledge_ingest_jobs_run_for_base(knowledge_base_id=kb) for kb in list(bases))


def knowledge_base_has_active_jobs(*, knowledge_base: KnowledgeBase) -> bool:
    return IngestJob.objects.filter(
        knowledge_base=knowledge_base, status__in=IngestJob.ACTIVE
    ).exists()


def knowledge_base_delete_chunks(
    *, knowledge_base: KnowledgeBase, document_keys: Sequence[str] | None = None,
    session_id: str | None = None,
) -> int:  # fmt: skip
    """Delete the chunks of some documents, of one session, or all; counters follow."""
    where = ["knowledge_base_id = %s"]
    params: list[Any] = [knowledge_base.pk]
    if document_keys is not None:
        where.append("document_key = ANY(%s)")
        params.append(list(document_keys))
    if session_id is not None:
        where.append("session_id = %s")
        params.append(session_id)
    with transaction.atomic():
        KnowledgeBase.objects.select_for_update().get(pk=knowledge_base.pk)
        with connection.cursor() as cur:
            cur.execute(
                f"WITH gone AS (DELETE FROM knowledge_chunk WHERE {' AND '.join(where)} "
                f"RETURNING word_count, text) SELECT {_AGGREGATE} FROM gone",
                params,
            )
            old = cur.fetchone()
            _apply_stats_delta(cur, knowledge_base, old, (0, 0, 0, 0))
    knowledge_base.refresh_from_db()
    return int(old[0])


def knowledge_base_recount(*, knowledge_base: KnowledgeBase) -> KnowledgeBase:
    """Recompute the counters from the chunks themselves.

    The counters are kept exact by every write that goes through these services;
    this repairs them after rows changed behind our back (a manual DELETE).
    """
    with transaction.atomic():
        KnowledgeBase.objects.select_for_update().get(pk=knowledge_base.pk)
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT {_AGGREGATE} FROM knowledge_chunk WHERE knowledge_base_id = %s",
                [knowledge_base.pk],
            )
            actual = cur.fetchone()
            cur.execute(
                "UPDATE knowledge_knowledgebase SET chunk_count = 0, word_count = 0, "
                "char_count = 0, size_bytes = 0 WHERE id = %s",
                [knowledge_base.pk],
            )
            _apply_stats_delta(cur, knowledge_base, (0, 0, 0, 0), actual)
    knowledge_base.refresh_from_db()
    return knowledge_base


# --- Background HNSW indexing ----------------------------------------------------------
INDEXER_LOCK = "knowledge:hnsw-indexer"


def enqueue_chunk_indexing() -> None:
    """Queue the indexer (after a commit that left pending rows). Never raises:
    the rows are searchable already, and the periodic sweep picks them up."""
    from django_q.tasks import async_task

    try:
        async_task("knowledge.tasks.index_pending_chunks", task_name="index-pending-chunks")
    except Exception:
        logger.exception("could not queue the chunk indexer; the periodic sweep will run it")


def _index_batch(batch: int) -> int | None:
    """Move up to ``batch`` pending rows into the HNSW index, in one transaction.

    Returns the number moved, or None when another indexer holds the lock.
    """
    with transaction.atomic(), connection.cursor() as cur:
        if not try_advisory_xact_lock(INDEXER_LOCK):
            return None
        # Clearing the flag writes a new row version, which the partial HNSW index
        # (NOT index_pending) takes in. SKIP LOCKED: rows a writer is replacing
        # right now are left for the next round (the writer marks them pending).
        # No ORDER BY: the partial index hands out the first pending rows it has
        # without sorting the whole backlog for every batch.
        cur.execute(
            "UPDATE knowledge_chunk SET index_pending = false WHERE id IN ("
            "  SELECT id FROM knowledge_chunk WHERE index_pending LIMIT %s"
            "  FOR UPDATE SKIP LOCKED)",
            [batch],
        )
        return cur.rowcount


def _any_pending() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT EXISTS (SELECT 1 FROM knowledge_chunk WHERE index_pending)")
        return bool(cur.fetchone()[0])


def knowledge_index_pending(
    *, batch: int | None = None, max_seconds: float | None = None
) -> IndexRun:
    """Index pending chunks until none are left or ``max_seconds`` have passed.

    One indexer at a time (a transaction-scoped advisory lock per batch); a run
    that finds the lock taken returns at once, and the holder looks for rows
    committed meanwhile after it lets go of the lock, so no row is left behind.
    Safe to run twice, at any time.
    """
    batch = batch or settings.KNOWLEDGE_INDEX_BATCH
    budget = settings.KNOWLEDGE_INDEX_RUN_SECONDS if max_seconds is None else max_seconds
    deadline = time.monotonic() + budget
    indexed = 0
    empty_rounds = 0
    while True:
        moved = _index_batch(batch)
        if moved is None:
            return IndexRun(indexed=indexed, finished=False, busy=True)
        indexed += moved
        if moved < batch:
            # The lock is released: anything committed since our last batch's
            # snapshot is visible now, including rows whose enqueue found us busy.
            if not _any_pending():
                return IndexRun(indexed=indexed, finished=True, busy=False)
            if moved == 0:
                # What is left is locked by a writer (which queues us again when it
                # commits) or by a long delete: wait a little, then leave it to them
                # and to the sweep rather than hold a worker.
                empty_rounds += 1
                if empty_rounds >= 20:
                    return IndexRun(indexed=indexed, finished=False, busy=True)
                time.sleep(0.05)
        if time.monotonic() >= deadline:
            return IndexRun(indexed=indexed, finished=False, busy=False)


def knowledge_pending_count() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM knowledge_chunk WHERE index_pending")
        return int(cur.fetchone()[0])
