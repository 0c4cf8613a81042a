"""Hybrid search runs its keyword ranking on a second connection, outside transactions."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from knowledge import search
from knowledge.search import SearchRequest, search_chunks
from tests.factories import UserFactory
from tests.knowledge.factories import ingest, make_kb


def _docs():
    return [
        (f"d{i}", f"entry {i}: the {['harbour', 'orchard', 'quarry'][i % 3]} report")
        for i in range(12)
    ]


def _run(kb, settings, parallel: bool):
    settings.SEARCH_PARALLEL_LEGS = parallel
    settings.SEARCH_ONE_STATEMENT = False  # the legs apart (else one statement, one connection)
    threads: set[str] = set()
    original = search.keyword_ranking

    def recording(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return original(*args, **kwargs)

    search.keyword_ranking = recording
    try:
        request = SearchRequest(query="orchard report", top_k=5)
        hits = search_chunks(bases=[kb], request=request)
    finally:
        search.keyword_ranking = original
    return [(h.chunk_id, round(h.score, 9), h.vector_rank, h.keyword_rank) for h in hits], threads


@pytest.mark.django_db(transaction=True)
def test_parallel_legs_give_the_sequential_answer(settings):
    kb = make_kb(UserFactory(username="dora"))
    ingest(kb, *_docs())
    sequential, seq_threads = _run(kb, settings, parallel=False)
    parallel, par_threads = _run(kb, settings, parallel=True)
    assert parallel == sequential and len(parallel) == 5
    assert seq_threads == {threading.current_thread().name}
    assert len(par_threads) == 1 and next(iter(par_threads)).startswith("search-leg")


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_both_legs_see_its_writes(settings):
    """Another connection could not see uncommitted rows: in a transaction the
    legs run in order on this connection."""
    settings.SEARCH_PARALLEL_LEGS = True
    kb = make_kb(UserFactory(username="erin"))
    with transaction.atomic():
        ingest(kb, *_docs())
        hits, threads = _run(kb, settings, parallel=True)
        assert len(hits) == 5
        assert all(h[3] is not None for h in hits[:2])  # keyword ranks came back
        assert threads == {threading.current_thread().name}
        transaction.set_rollback(True)
    assert connection.in_atomic_block is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # starts a process
def test_a_forked_child_gets_its_own_pool(settings):
    """gunicorn and qcluster fork workers: the pool's threads do not survive a fork."""
    import os

    kb = make_kb(UserFactory(username="fern"))
    ingest(kb, *_docs())
    before, _ = _run(kb, settings, parallel=True)
    parent_pool = search._legs_executor
    assert parent_pool is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's pool object
        os.close(read)
        os.write(write, b"1" if search._legs_executor is None else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert search._legs_executor is parent_pool
    assert _run(kb, settings, parallel=True)[0] == before


@pytest.mark.parametrize(
    ("rows", "limit", "scale", "expected"),
    [
        (0, 10, True, 100),
        (100_000, 10, True, 100),
        (1_000_000, 10, True, 200),
        (10_000_000, 10, True, 300),
        (1_000_000, 10, False, 100),
        (50_000, 300, True, 600),  # at least twice the rows wanted
        (10**15, 10, True, 1000),  # 1,100 capped at pgvector's maximum
    ],
)
def test_ef_search_grows_with_the_index(settings, monkeypatch, rows, limit, scale, expected):
    settings.SEARCH_EF_SEARCH = 100
    settings.SEARCH_EF_SEARCH_SCALE = scale
    monkeypatch.setattr(search, "_index_rows", lambda dims: float(rows))
    assert search.ef_search_for(384, limit) == expected


@pytest.mark.django_db
def test_index_rows_reads_the_planner_statistics(alice):
    search._index_rows_cache.clear()
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples FROM pg_class WHERE relname = 'chunk_hnsw_half_384'")
        (stats,) = cur.fetchone()
    assert search._index_rows(384) == max(stats, 0.0)
    assert search._index_rows(999) == 0.0  # no such index
    search._index_rows_cache.clear()
