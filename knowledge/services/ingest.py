"""The ingestion helper: chunk, embed (outside any transaction) and write a batch of
documents in one transaction; delete and recount chunks."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from core.db_recovery import refresh_after_commit
from core.providers.embeddings import Embedder
from knowledge.chunking import chunk_text
from knowledge.models import INDEXED_DIMENSIONS, KnowledgeBase
from knowledge.selectors import kb_embedder
from knowledge.services.errors import (
    DocumentIn,
    IngestCancelled,
    IngestResult,
    KnowledgeError,
)
from knowledge.services.indexing import enqueue_chunk_indexing_on_commit


@dataclass
class _ChunkRow:
    document: DocumentIn
    source_key: str
    text: str
    index: int
    total: int


def _chunk_documents(kb: KnowledgeBase, documents: Sequence[DocumentIn]) -> list[_ChunkRow]:
    rows: list[_ChunkRow] = []
    for doc in documents:
        pieces = chunk_text(doc.text, size=kb.chunk_size, overlap=kb.chunk_overlap)
        for index, piece in enumerate(pieces):
            rows.append(
                _ChunkRow(
                    document=doc,
                    source_key=f"{doc.source_key}#{index}",
                    text=piece,
                    index=index,
                    total=len(pieces),
                )
            )
    return rows


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
    *("text", "text", "text", "vector", "text", "int4", "int4", "text", "text", "text"),
    *("text", "text", "text", "text", "text", "timestamptz", "jsonb", "int4"),
]
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
ON CONFLICT ON CONSTRAINT chunk_unique_source_key DO UPDATE SET
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
    doc = row.document
    return (
        row.source_key,
        doc.source_key,
        row.text,
        vector,
        kb.language,
        row.index,
        row.total,
        doc.source_type,
        doc.message_id,
        doc.session_id,
        doc.flow_id,
        doc.run_id,
        doc.sender,
        doc.file_path,
        doc.content_hash,
        doc.timestamp,
        Jsonb(dict(doc.metadata)),
        len(row.text.split()),
    )


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
    """New chunks wait for the background indexer (``knowledge_index_pending``) instead of
    paying for HNSW insertion in the write; searches rank them exactly meanwhile."""
    return kb.embedding_dimensions in INDEXED_DIMENSIONS


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
    embedder: Embedder | None = None,
) -> IngestResult:
    """Chunk, embed and store ``documents``; return only after the write is committed.

    Embedding happens first, in batches, outside any transaction (network calls
    must not hold locks). Then every chunk is written in one transaction: a
    failure leaves nothing partial visible. Source keys are deterministic
    (``<document source_key>#<chunk index>``), so re-ingesting a document updates
    its chunks in place and drops the ones it no longer has; a retry of the same
    batch yields the same rows. ``should_cancel`` is checked between embedding
    batches and raises ``IngestCancelled`` before anything is written. ``embedder``
    replaces the one built from the base's recorded configuration (a caller with its
    own endpoint, e.g. a memory store's ``embedding`` block); it must produce the
    base's dimension.
    """
    keys = _check_batch(documents)
    rows = _chunk_documents(knowledge_base, documents)
    if embedder is not None and embedder.dimensions != knowledge_base.embedding_dimensions:
        raise KnowledgeError(
            f"the embedder has {embedder.dimensions} dimensions; knowledge base "
            f"{knowledge_base.name!r} holds {knowledge_base.embedding_dimensions}"
        )
    embedder = embedder or kb_embedder(knowledge_base)
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
            enqueue_chunk_indexing_on_commit()
    refresh_after_commit(knowledge_base)
    return IngestResult(documents=len(documents), chunks_written=written, chunks_deleted=deleted)


def _check_batch(documents: Sequence[DocumentIn]) -> list[str]:
    keys = [doc.source_key for doc in documents]
    if len(set(keys)) != len(keys):
        raise KnowledgeError("source_key values must be unique within a batch")
    return keys


def knowledge_base_delete_chunks(
    *,
    knowledge_base: KnowledgeBase,
    document_keys: Sequence[str] | None = None,
    session_id: str | None = None,
) -> int:
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


@dataclass(frozen=True)
class ChunkIn:
    """A chunk as an export holds it (not chunked again): its keys, text, vector (of
    the base's model and dimension), place in its document and sources."""

    source_key: str
    document_key: str
    text: str
    embedding: Sequence[float]
    chunk_index: int = 0
    chunk_total: int = 1
    document: DocumentIn | None = None  # its source fields (message, session, flow...)


def knowledge_base_restore_chunks(
    *, knowledge_base: KnowledgeBase, chunks: Sequence[ChunkIn]
) -> int:
    """Write exported chunks into the base as they were, in the caller's transaction
    (``_write_chunks``: upserted by source key, a document's other chunks dropped; new
    chunks wait for the background indexer, searchable exactly at once). Returns how
    many chunks the base gained."""
    if not chunks:
        return 0
    dims = knowledge_base.embedding_dimensions
    wrong = [c.source_key for c in chunks if len(c.embedding) != dims]
    if wrong:
        raise KnowledgeError(
            f"chunk {wrong[0]!r} has a vector of another dimension than the base's ({dims})"
        )
    before = knowledge_base.chunks.count()
    rows = [
        _stage_row(knowledge_base,
                   _ChunkRow(c.document or DocumentIn(text=c.text, source_key=c.document_key),
                             c.source_key, c.text, c.chunk_index, c.chunk_total),
                   list(c.embedding))
        for c in chunks
    ]  # fmt: skip
    keys = list(dict.fromkeys(c.document_key for c in chunks))
    KnowledgeBase.objects.select_for_update().get(pk=knowledge_base.pk)
    _write_chunks(knowledge_base, rows, keys)
    if _defer_indexing(knowledge_base):
        enqueue_chunk_indexing_on_commit()
    return knowledge_base.chunks.count() - before
