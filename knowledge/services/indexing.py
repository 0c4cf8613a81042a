"""Background HNSW indexing: move pending rows into their index in batches.

Tables whose rows a bulk write leaves pending (``index_pending``, outside their partial
HNSW indexes; searches rank them exactly meanwhile): knowledge chunks (ingestion) and
facts (``memories.facts``: an import). Each has its own indexer lock."""

from __future__ import annotations

import logging
import time

from django.db import connection, transaction

from core.db import try_advisory_xact_lock
from core.queue import enqueue, enqueue_on_commit
from knowledge.services.errors import IndexRun

logger = logging.getLogger(__name__)
INDEXER_LOCK = "knowledge:hnsw-indexer"
PENDING_TABLES = {"knowledge_chunk": INDEXER_LOCK, "memories_fact": "memories:fact-hnsw-indexer"}


def enqueue_chunk_indexing() -> None:
    """Queue the indexer. Never raises: the rows are searchable already, and the
    periodic sweep picks them up."""
    enqueue("knowledge.tasks.index_pending_chunks", task_name="index-pending-chunks")


def enqueue_chunk_indexing_on_commit() -> None:
    """Queue the indexer once the write that left pending rows commits."""
    enqueue_on_commit("knowledge.tasks.index_pending_chunks", task_name="index-pending-chunks")


def _index_batch(batch: int, table: str = "knowledge_chunk") -> int | None:
    """Move up to ``batch`` pending rows into the HNSW index, in one transaction.

    Returns the number moved, or None when another indexer holds the lock.
    """
    with transaction.atomic(), connection.cursor() as cur:
        if not try_advisory_xact_lock(PENDING_TABLES[table]):
            return None
        # Clearing the flag writes a new row version, which the partial HNSW index
        # (NOT index_pending) takes in. SKIP LOCKED: rows a writer is replacing
        # right now are left for the next round (the writer marks them pending).
        # No ORDER BY: the partial index hands out the first pending rows it has
        # without sorting the whole backlog for every batch. The ids are picked once
        # (ARRAY(...)): under "id IN (SELECT ... LIMIT n)" the planner may rescan the
        # subquery per row of a nested loop, each rescan taking n more (a batch of 2
        # moved 5 rows once).
        cur.execute(
            f"UPDATE {table} SET index_pending = false WHERE id = ANY(ARRAY("
            f"  SELECT id FROM {table} WHERE index_pending LIMIT %s"
            "  FOR UPDATE SKIP LOCKED))",
            [batch],
        )
        return cur.rowcount


def _any_pending(table: str = "knowledge_chunk") -> bool:
    with connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE index_pending)")
        return bool(cur.fetchone()[0])


# Chunks put in the HNSW index per transaction; one indexer run stops after
# INDEX_RUN_SECONDS and queues its successor (well below a task's timeout).
INDEX_BATCH = 200
INDEX_RUN_SECONDS = 60.0


def knowledge_index_pending(
    *, batch: int | None = None, max_seconds: float | None = None, table: str = "knowledge_chunk"
) -> IndexRun:
    """Index pending rows of ``table`` (one of ``PENDING_TABLES``) until none are left
    or ``max_seconds`` have passed.

    One indexer at a time (a transaction-scoped advisory lock per batch); a run
    that finds the lock taken returns at once, and the holder looks for rows
    committed meanwhile after it lets go of the lock, so no row is left behind.
    Safe to run twice, at any time.
    """
    batch = batch or INDEX_BATCH
    budget = INDEX_RUN_SECONDS if max_seconds is None else max_seconds
    deadline = time.monotonic() + budget
    indexed = 0
    empty_rounds = 0
    while True:
        moved = _index_batch(batch, table)
        if moved is None:
            return IndexRun(indexed=indexed, finished=False, busy=True)
        indexed += moved
        if moved < batch:
            # The lock is released: anything committed since our last batch's
            # snapshot is visible now, including rows whose enqueue found us busy.
            if not _any_pending(table):
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


def knowledge_pending_count(table: str = "knowledge_chunk") -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table} WHERE index_pending")
        return int(cur.fetchone()[0])
