"""Deferred HNSW indexing: rows are searchable at commit, indexed in the background.

Ingestion writes chunks with ``index_pending = true`` (no HNSW insertion in the
write); ``knowledge_index_pending`` (the task ``index_pending_chunks``) clears the
flag in batches, which adds the rows to the partial HNSW index.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import psycopg
import pytest
from django.db import connection
from django_q.models import Schedule

from core.db import _lock_id
from knowledge import search, tasks
from knowledge.models import Chunk
from knowledge.search import SearchRequest, search_chunks
from knowledge.services import knowledge_index_pending, knowledge_pending_count
from knowledge.services.indexing import INDEXER_LOCK
from tests.knowledge.factories import ingest, make_kb

pytestmark = pytest.mark.django_db


def _pending(kb) -> list[str]:
    return sorted(
        Chunk.objects.filter(knowledge_base=kb, index_pending=True).values_list(
            "source_key", flat=True
        )
    )


def _docs(n: int, prefix: str = "d") -> list[tuple[str, str]]:
    return [
        (f"{prefix}{i}", f"note {i} about topic {i % 7} and lighthouse keepers") for i in range(n)
    ]


def test_ingest_leaves_rows_pending_and_the_indexer_clears_them(alice):
    kb = make_kb(alice)
    ingest(kb, *_docs(5))
    assert _pending(kb) == [f"d{i}#0" for i in range(5)]
    assert knowledge_pending_count() == 5

    run = knowledge_index_pending(batch=2)
    assert (run.indexed, run.finished, run.busy) == (5, True, False)
    assert _pending(kb) == []
    # Safe to run twice: nothing left, nothing changes.
    assert knowledge_index_pending().indexed == 0
    assert Chunk.objects.filter(knowledge_base=kb).count() == 5

    # Re-ingesting a document (new text, new vector) puts its chunk back in the queue.
    ingest(kb, ("d3", "a rewritten note"))
    assert _pending(kb) == ["d3#0"]
    assert Chunk.objects.get(knowledge_base=kb, source_key="d3#0").text == "a rewritten note"


def test_pending_rows_are_found_on_the_index_path(alice, monkeypatch):
    """A scope large enough for HNSW: indexed rows come from the index, pending ones
    from the exact scan next to it, merged into one ranking."""
    monkeypatch.setattr(search, "CHUNKS", replace(search.CHUNKS, exact_max=0, walk_min_share=0.0))
    kb = make_kb(alice)
    ingest(kb, *_docs(30))
    knowledge_index_pending()
    ingest(kb, ("fresh", "the harbour lighthouse keeper logbook entry"))
    assert _pending(kb) == ["fresh#0"]
    for mode in ("vector", "hybrid", "keyword"):
        request = SearchRequest(query="harbour lighthouse keeper logbook entry", top_k=3, mode=mode)
        hits = search_chunks(bases=[kb], request=request)
        assert len(hits) == 3
        assert hits[0].metadata["source_key"] == "fresh#0", mode


def test_a_busy_indexer_makes_a_second_run_return_at_once(alice):
    kb = make_kb(alice)
    ingest(kb, *_docs(3))
    # Another process holds the indexer lock (a second connection, as a worker would).
    params = connection.get_connection_params()
    holder = psycopg.connect(
        host=params["host"], port=params["port"], user=params["user"], dbname=params["dbname"]
    )
    try:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_id(INDEXER_LOCK)])
        run = knowledge_index_pending()
        assert (run.indexed, run.finished, run.busy) == (0, False, True)
        assert len(_pending(kb)) == 3
    finally:
        holder.rollback()
        holder.close()
    assert knowledge_index_pending().indexed == 3
    assert _pending(kb) == []


def test_ingestion_queues_the_indexer_after_commit(alice, django_capture_on_commit_callbacks):
    kb = make_kb(alice)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        ingest(kb, *_docs(4))
    assert len(callbacks) == 1
    assert len(_pending(kb)) == 4
    # Q_CLUSTER runs tasks inline in tests: the queued task indexes the rows.
    callbacks[0]()
    assert _pending(kb) == []


def test_a_run_out_of_time_queues_its_successor(alice, monkeypatch):
    # (the constants the indexer the task calls reads)
    constants = tasks.knowledge_index_pending.__globals__
    monkeypatch.setitem(constants, "INDEX_BATCH", 2)
    monkeypatch.setitem(constants, "INDEX_RUN_SECONDS", 0)  # one batch per run
    kb = make_kb(alice)
    ingest(kb, *_docs(5))
    runs = []
    original = tasks.knowledge_index_pending

    def counting():
        run = original()
        runs.append(run.indexed)
        return run

    monkeypatch.setattr(tasks, "knowledge_index_pending", counting)
    assert tasks.index_pending_chunks() == 2
    # Each successor ran inline (sync task queue) and did one batch.
    assert runs == [2, 2, 1]
    assert _pending(kb) == []


def test_bases_outside_the_indexed_dimensions_are_never_pending(alice, settings):
    settings.EMBEDDING_DIMENSIONS = 383
    kb = make_kb(alice, name="odd")
    assert kb.embedding_dimensions == 383
    ingest(kb, *_docs(3))
    assert _pending(kb) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_indexers_leave_nothing_pending():
    from tests.factories import UserFactory

    kb = make_kb(UserFactory(username="carol"))
    ingest(kb, *_docs(60))
    Chunk.objects.filter(knowledge_base=kb).update(index_pending=True)  # undo the inline task
    results = []
    barrier = threading.Barrier(3)

    def worker():
        barrier.wait()
        try:
            results.append(knowledge_index_pending(batch=5))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.indexed for r in results) == 60
    assert any(r.finished for r in results)
    assert _pending(kb) == []


def test_the_periodic_sweep_is_registered():
    sweep = Schedule.objects.get(name="index-pending-chunks")
    assert (sweep.func, sweep.schedule_type, sweep.minutes) == (
        "knowledge.tasks.index_pending_chunks",
        Schedule.MINUTES,
        5,
    )


def test_metrics_report_the_indexer_backlog(alice, admin_client):
    client = admin_client  # a staff session may read /metrics
    kb = make_kb(alice)
    ingest(kb, *_docs(3))
    assert "\nknowledge_chunks_index_pending 3\n" in client.get("/metrics").content.decode()
    knowledge_index_pending()
    assert "\nknowledge_chunks_index_pending 0\n" in client.get("/metrics").content.decode()
