"""A large search runs its keyword leg on a second connection, outside transactions; the
HNSW walk's settings grow with the index."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from knowledge import search
from knowledge.retrieval import db, hnsw
from knowledge.retrieval.engine import Leg
from knowledge.search import SearchRequest, search_chunks
from tests.factories import UserFactory
from tests.knowledge.factories import ingest, make_kb


def _docs():
    return [
        (f"d{i}", f"entry {i}: the {['harbour', 'orchard', 'quarry'][i % 3]} report")
        for i in range(12)
    ]


def leg_threads(monkeypatch) -> set[str]:
    """The names of the threads each search leg runs on, from now on (``Leg.run``)."""
    threads: set[str] = set()
    original = Leg.run

    def recording(leg):
        threads.add(threading.current_thread().name)
        return original(leg)

    monkeypatch.setattr(Leg, "run", recording)
    return threads


def _run(kb, monkeypatch, split_min_rows: int):
    monkeypatch.setattr(search, "SPLIT_MIN_ROWS", split_min_rows)
    original = Leg.run
    threads = leg_threads(monkeypatch)
    try:
        request = SearchRequest(query="orchard report", top_k=5)
        hits = search_chunks(bases=[kb], request=request)
    finally:
        monkeypatch.setattr(Leg, "run", original)
    return [(h.chunk_id, h.score, h.vector_rank, h.keyword_rank) for h in hits], threads


@pytest.mark.django_db(transaction=True)
def test_split_legs_give_the_one_statements_answer(monkeypatch):
    kb = make_kb(UserFactory(username="dora"))
    ingest(kb, *_docs())
    one, one_threads = _run(kb, monkeypatch, split_min_rows=10**9)
    split, split_threads = _run(kb, monkeypatch, split_min_rows=0)
    assert split == one and len(split) == 5
    assert one_threads == set()  # the legs ran inside the one statement
    here = threading.current_thread().name
    assert here in split_threads and len(split_threads) == 2
    assert any(name.startswith("search-leg") for name in split_threads)


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_both_legs_see_its_writes(monkeypatch):
    """Another connection could not see uncommitted rows: in a transaction the search is
    one statement on this connection."""
    kb = make_kb(UserFactory(username="erin"))
    with transaction.atomic():
        ingest(kb, *_docs())
        hits, threads = _run(kb, monkeypatch, split_min_rows=0)
        assert len(hits) == 5
        assert all(h[3] is not None for h in hits[:2])  # keyword ranks came back
        assert threads == set()
        transaction.set_rollback(True)
    assert connection.in_atomic_block is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # starts a process
def test_a_forked_child_gets_its_own_pool(monkeypatch):
    """gunicorn and qcluster fork workers: the pool's threads do not survive a fork."""
    import os

    kb = make_kb(UserFactory(username="fern"))
    ingest(kb, *_docs())
    before, _ = _run(kb, monkeypatch, split_min_rows=0)
    parent_pool = db._legs_executor
    assert parent_pool is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's pool object
        os.close(read)
        os.write(write, b"1" if db._legs_executor is None else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert db._legs_executor is parent_pool
    assert _run(kb, monkeypatch, split_min_rows=0)[0] == before


@pytest.mark.parametrize(
    ("rows", "limit", "expected"),
    [
        (0, 10, 100),
        (100_000, 10, 100),
        (1_000_000, 10, 200),
        (10_000_000, 10, 300),
        (50_000, 300, 600),  # at least twice the rows wanted
        (10**15, 10, 1000),  # 1,100 capped at pgvector's maximum
    ],
)
def test_ef_search_grows_with_the_index(monkeypatch, rows, limit, expected):
    monkeypatch.setattr(hnsw, "row_count", lambda relname: float(rows))
    monkeypatch.setattr(hnsw, "index_name", lambda prefix, dims: f"{prefix}_half_{dims}")
    assert hnsw.ef_search("chunk_hnsw", 384, limit) == expected


@pytest.mark.parametrize(
    ("rows", "limit", "expected"),
    [
        (10_000, 30, 60),  # the facts' base, 40, and at least twice the 30 candidates
        (10_000, 10, 40),
        (100_000, 10, 40),
        (1_000_000, 10, 200),  # past 100,000 rows, grown from EF_SEARCH as the others
    ],
)
def test_a_collection_walks_from_its_own_ef_search(monkeypatch, rows, limit, expected):
    from memories.facts.search import FACTS, _vector_pool

    monkeypatch.setattr(hnsw, "row_count", lambda relname: float(rows))
    monkeypatch.setattr(hnsw, "index_name", lambda prefix, dims: f"{prefix}_half_{dims}")
    monkeypatch.setattr(hnsw, "iterative_scan", lambda: True)
    assert FACTS.ef_search == 40 and _vector_pool(10, 0) == 30
    settings = dict(hnsw.walk_settings("fact_hnsw", 384, limit, FACTS.ef_search))
    assert settings["hnsw.ef_search"] == expected


@pytest.mark.django_db
def test_row_count_reads_the_planner_statistics(alice):
    hnsw._row_counts.clear()
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples FROM pg_class WHERE relname = 'chunk_hnsw_half_384'")
        (stats,) = cur.fetchone()
    assert hnsw.row_count(hnsw.index_name("chunk_hnsw", 384)) == max(stats, 0.0)
    assert hnsw.row_count("chunk_hnsw_half_999") == 0.0  # no such index
    assert hnsw.index_type("chunk_hnsw", 999) is None  # no index of that dimension
    hnsw._row_counts.clear()


@pytest.mark.django_db(transaction=True)
def test_the_pruned_keyword_leg_runs_beside_the_vector_leg(monkeypatch):
    """The pruned BM25 leg (its own statements, computed in Python) is run by the split,
    on the pool's thread while the vector leg runs here, not while the search is planned:
    the same answer as the one statement."""
    from knowledge.retrieval import bm25

    kb = make_kb(UserFactory(username="pia"))
    ingest(kb, *_docs())
    monkeypatch.setattr(bm25, "PRUNE_MIN_ROWS", 0)
    ran: list[str] = []
    original = bm25._pruned

    def recording(*args, **kwargs):
        ran.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(bm25, "_pruned", recording)
    one, _ = _run(kb, monkeypatch, split_min_rows=10**9)
    assert ran == [threading.current_thread().name]  # one statement: run here, first
    ran.clear()
    split, _ = _run(kb, monkeypatch, split_min_rows=0)
    assert split == one and len(split) == 5
    assert len(ran) == 1 and ran[0].startswith("search-leg")
