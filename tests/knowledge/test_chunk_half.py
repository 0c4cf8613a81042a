"""The chunks' 16-bit copies (``knowledge_chunk_half``, migration 0018): kept by the
database on every chunk write, and a search that ranks a scope exactly through them
answers what the same search through the chunk table answers, near ties included; the
filters the copies do not hold, and vectors of more than 1,024 dimensions, rank from
the table."""

from __future__ import annotations

import importlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.db import connection

from core.db_backend.base import service_role, table_owner
from core.providers.embeddings import EmbeddingConfig
from core.row_security import secure_tables
from knowledge import search
from knowledge.models import Chunk
from knowledge.retrieval import hnsw
from knowledge.search import SearchRequest, search_chunks
from knowledge.services import (
    knowledge_base_delete,
    knowledge_base_delete_chunks,
    knowledge_base_recount,
)
from tests.factories import UserFactory
from tests.half_copies import copies_of, copies_out_of_sync
from tests.knowledge.factories import ingest, make_kb

pytestmark = pytest.mark.django_db
COPIED = "id, owner_id, knowledge_base_id, session_id, dimensions, source_timestamp, created_at"
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def out_of_sync() -> list[tuple]:
    """Rows where a copy differs from what the chunks say it must hold (both ways)."""
    return copies_out_of_sync(
        table="knowledge_chunk", copies="knowledge_chunk_half", columns=COPIED,
        where="dimensions <= 1024",
    )  # fmt: skip


def copies(kb) -> dict[int, tuple]:
    return copies_of("knowledge_chunk_half", "ctid::text, session_id", "knowledge_base_id", kb.pk)


def base(owner, name: str, dims: int = 384):
    return make_kb(owner, name, embedding=EmbeddingConfig("seeded", f"seeded-{dims}", dims))


def write(kb, vectors: np.ndarray, sessions: int = 3, prefix: str = "row") -> list[Chunk]:
    """Chunks holding these vectors, in ``sessions`` sessions, a day apart, written in
    bulk (as a COPY would), one flow each for even and odd rows."""
    rows = [
        Chunk(
            knowledge_base=kb, source_key=f"{prefix}-{i}", document_key=f"{prefix}-{i}",
            text=f"{prefix} {i} {['tea', 'chess', 'sailing'][i % 3]}",
            embedding=v.astype(np.float32).tolist(), dimensions=len(v),
            session_id=f"s{i % sessions}", flow_id=f"f{i % 2}",
            source_timestamp=T0 + timedelta(days=i),
        )
        for i, v in enumerate(vectors)
    ]  # fmt: skip
    made = Chunk.objects.bulk_create(rows)
    knowledge_base_recount(knowledge_base=kb)
    kb.refresh_from_db()
    return made


def unit(rng, n: int, dims: int = 384) -> np.ndarray:
    v = rng.standard_normal((n, dims))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def ring(rng, centre: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """Unit vectors at these cosine distances from ``centre``, in random directions."""
    u = rng.standard_normal((len(distances), len(centre)))
    u -= np.outer(u @ centre, centre)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    c = 1.0 - distances
    return c[:, None] * centre + np.sqrt(1.0 - c * c)[:, None] * u


def both_ways(monkeypatch, kb, request: SearchRequest) -> tuple[list, list, str]:
    """(hits through the copies, hits through the table, the vector leg's SQL)."""

    def ranked():
        return [(h.chunk_id, h.score, h.vector_score, h.keyword_score)
                for h in search_chunks(bases=[kb], request=request)]  # fmt: skip

    leg = search._vector_leg([kb], request, 50)
    through_copies = ranked()
    monkeypatch.setattr(search, "CHUNKS", replace(search.CHUNKS, copies=""))
    through_table = ranked()
    monkeypatch.setattr(search, "CHUNKS", replace(search.CHUNKS, copies="knowledge_chunk_half"))
    return through_copies, through_table, leg.sql


def test_the_copy_follows_every_chunk_write():
    alice = UserFactory(username="alice")
    rng = np.random.default_rng(1)
    a, b, big = base(alice, "a"), base(alice, "b"), base(alice, "big", dims=1536)
    made = write(a, unit(rng, 6))
    write(b, unit(rng, 2))
    write(big, unit(rng, 2, dims=1536))
    assert out_of_sync() == []
    assert (len(copies(a)), len(copies(b)), len(copies(big))) == (6, 2, 0)  # 1536: none

    # A new session or a new vector replaces the copy; an edit of the text, the metadata
    # or index_pending alone leaves it as it was.
    before = copies(a)
    Chunk.objects.filter(pk=made[0].pk).update(session_id="moved")
    Chunk.objects.filter(pk=made[1].pk).update(
        embedding=unit(rng, 1)[0].astype(np.float32).tolist()
    )
    Chunk.objects.filter(pk=made[2].pk).update(
        text="changed", metadata={"k": 1}, index_pending=True
    )
    after = copies(a)
    assert out_of_sync() == []
    assert after[made[0].pk][1] == "moved" and after[made[0].pk][0] != before[made[0].pk][0]
    assert after[made[1].pk][0] != before[made[1].pk][0]
    assert after[made[2].pk] == before[made[2].pk]

    # Deleted one by one, and with their base (a cascade).
    Chunk.objects.filter(pk=made[3].pk).delete()
    assert made[3].pk not in copies(a) and out_of_sync() == []
    knowledge_base_delete(knowledge_base=a)
    assert copies(a) == {} and len(copies(b)) == 2 and out_of_sync() == []


@pytest.mark.django_db(transaction=True)
def test_a_truncate_of_the_chunks_empties_the_copies():
    alice = UserFactory(username="alice")
    write(base(alice, "a"), unit(np.random.default_rng(2), 3))
    with table_owner(connection), connection.cursor() as cur:  # (TRUNCATE: the owner's)
        cur.execute("SELECT count(*) FROM knowledge_chunk_half")
        assert cur.fetchone()[0] == 3
        cur.execute("TRUNCATE knowledge_chunk CASCADE")
        cur.execute("SELECT count(*) FROM knowledge_chunk_half")
        assert cur.fetchone()[0] == 0


def test_a_search_through_the_copies_is_the_search_through_the_table(monkeypatch):
    """60 chunks 0.000003 apart in distance to the query (a 16-bit copy is off by up to
    0.00003): the copies alone would rank them otherwise; the search's answer is the
    table's, to the score. And 1,500 random chunks, by base, session, time range and a
    filter the copies do not hold (the table then)."""
    alice = UserFactory(username="alice")
    rng = np.random.default_rng(5)
    centre = unit(rng, 1)[0]
    near = base(alice, "near")
    write(near, ring(rng, centre, 0.3 + 3e-6 * rng.permutation(60)))
    for top_k in (1, 5, 10, 30, 60):
        request = SearchRequest(vector=centre.tolist(), top_k=top_k, mode="vector")
        got, want, sql = both_ways(monkeypatch, near, request)
        assert got == want and len(got) == top_k and "knowledge_chunk_half" in sql
    with connection.cursor() as cur:  # (the copies alone pick other chunks)
        cur.execute(
            "SELECT id FROM knowledge_chunk_half WHERE knowledge_base_id = %s "
            "ORDER BY half <=> l2_normalize(%s::vector)::halfvec, id LIMIT 10",
            [near.pk, centre.tolist()],
        )
        assert [r[0] for r in cur.fetchall()] != [h[0] for h in got[:10]]

    crowd = base(alice, "crowd")
    write(crowd, unit(rng, 1500), sessions=5)
    since, until = T0 + timedelta(days=100), T0 + timedelta(days=900)
    cases = [
        ({}, None, None, True),
        ({"session_id": "s3"}, None, None, True),
        ({}, since, until, True),
        ({"session_id": "s1"}, since, None, True),
        ({"flow_id": "f1"}, None, None, False),  # (not in the copies: the table)
    ]
    for filters, lo, hi, in_copies in cases:
        for mode in ("vector", "hybrid"):
            q = unit(rng, 1)[0]
            request = SearchRequest(query="tea chess" if mode == "hybrid" else None,
                                    vector=q.tolist(), top_k=10, mode=mode,
                                    filters=filters, since=lo, until=hi)  # fmt: skip
            got, want, sql = both_ways(monkeypatch, crowd, request)
            assert got == want and len(got) == 10, (filters, mode)
            assert ("knowledge_chunk_half" in sql) == in_copies


def test_a_walk_that_comes_back_short_is_redone_from_the_copies_exactly(monkeypatch):
    """A scope that always walks (its size known), rare in its table, and whose walk stops
    before it has the rows wanted (hnsw.max_scan_tuples read) is ranked again, exactly,
    from the 16-bit copies: the exact ranking's hits, to the score."""
    alice = UserFactory(username="alice")
    rng = np.random.default_rng(11)
    crowd, other = base(alice, "crowd"), base(alice, "other")
    centre = unit(rng, 1)[0]
    # (crowd: 2% of the index, across it from the queries: a walk's first pass meets
    # only the other base's rows)
    write(crowd, ring(rng, -centre, 0.2 + 0.05 * rng.random(60)), prefix="c")
    write(other, unit(rng, 2940), prefix="o")
    walking = replace(search.CHUNKS, exact_max=0, walk_min_share=0.0)
    monkeypatch.setattr(search, "CHUNKS", walking)
    monkeypatch.setattr(hnsw, "MAX_SCAN_TUPLES", 1)  # (the walk stops after its first pass)
    # (on 3,000 rows the planner takes the HNSW index at pgvector's ef_search, 40; at the
    # project's 100 it prefers to rank them all: test_search_property.py)
    monkeypatch.setattr(hnsw, "EF_SEARCH", 40)
    with connection.cursor() as cur:
        cur.execute("ANALYZE knowledge_chunk")  # (the table's size: crowd is rare in it)
        cur.execute("SET LOCAL enable_seqscan = off")  # (searches' plan policy)
        # (and no ranking of every row by a sort: the order comes from the walk, which a
        # planner holding other tests' statistics could otherwise skip)
        cur.execute("SET LOCAL enable_sort = off")
    monkeypatch.setattr(hnsw, "_row_counts", {})
    for _ in range(3):
        query = ring(rng, centre, np.array([0.1]))[0]
        request = SearchRequest(vector=query.tolist(), top_k=20, mode="vector")
        leg = search._vector_leg([crowd], request, 20)
        assert leg.path == "index" and "FROM knowledge_chunk_half" in leg.sql
        assert not any(row[2] for row in leg.run()), "the walk did not come back short"
        short = [(h.chunk_id, h.score) for h in search_chunks(bases=[crowd], request=request)]
        monkeypatch.setattr(search, "CHUNKS", replace(walking, exact_max=10**9))
        exact = [(h.chunk_id, h.score) for h in search_chunks(bases=[crowd], request=request)]
        monkeypatch.setattr(search, "CHUNKS", walking)
        assert short == exact and len(short) == 20
    # A scope of most of the table keeps the table for a redo it does not need.
    request = SearchRequest(vector=unit(rng, 1)[0].tolist(), top_k=20, mode="vector")
    leg = search._vector_leg([other], request, 20)
    assert leg.path == "index" and "knowledge_chunk_half" not in leg.sql


def test_vectors_past_1024_dimensions_are_ranked_from_the_table(monkeypatch):
    alice = UserFactory(username="alice")
    rng = np.random.default_rng(7)
    kb = base(alice, "wide", dims=1536)
    write(kb, unit(rng, 40, dims=1536))
    q = unit(rng, 1, dims=1536)[0]
    got, want, sql = both_ways(monkeypatch, kb, SearchRequest(vector=q.tolist(), mode="vector"))
    assert got == want and len(got) == 10 and "knowledge_chunk_half" not in sql


@pytest.mark.django_db(transaction=True)  # (its index is built concurrently, then VACUUM)
def test_the_migration_copies_the_chunks_already_there(monkeypatch):
    """Migration 0018 on a table that holds chunks: the copies are made in batches (three
    chunks each here), every chunk of at most 1,024 dimensions; the triggers are back."""
    alice = UserFactory(username="alice")
    rng = np.random.default_rng(9)
    kb = base(alice, "a")
    write(kb, unit(rng, 8))
    write(base(alice, "wide", dims=1536), unit(rng, 2, dims=1536))
    migration = importlib.import_module("knowledge.migrations.0018_chunk_half")
    monkeypatch.setattr(migration, "BATCH", 3)
    with table_owner(connection), connection.schema_editor(atomic=False) as editor:
        migration.backward(None, editor)
        with connection.cursor() as cur:
            cur.execute("SELECT to_regclass('knowledge_chunk_half')")
            assert cur.fetchone()[0] is None
        migration.forward(None, editor)
        secure_tables(connection, service_role(connection))  # (as every migrate does)
    assert out_of_sync() == [] and len(copies(kb)) == 8
    write(kb, unit(rng, 1), prefix="later")
    assert out_of_sync() == [] and len(copies(kb)) == 9


def test_the_copies_follow_the_ingest_service():
    """Through the documents' write path (a COPY into a stage, then one upsert: its
    INSERT and its ON CONFLICT UPDATE each fire their triggers), a re-ingest that moves
    a document to another session and another text, and the deletes by session."""
    alice = UserFactory(username="alice")
    kb = make_kb(alice, "docs")
    ingest(kb, ("a", "alpha text", {"session_id": "s1"}), ("b", "beta text", {"session_id": "s2"}),
           ("c", "gamma text"))  # fmt: skip
    assert out_of_sync() == [] and len(copies(kb)) == 3
    ingest(kb, ("a", "alpha text, again and longer", {"session_id": "s9"}), ("d", "delta"))
    assert out_of_sync() == [] and len(copies(kb)) == 4
    assert sorted(session for _, session in copies(kb).values()) == ["", "", "s2", "s9"]
    assert knowledge_base_delete_chunks(knowledge_base=kb, session_id="s9") == 1
    assert out_of_sync() == [] and len(copies(kb)) == 3


def _storage(relation: str) -> str:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'half'",
            [relation],
        )
        return cur.fetchone()[0]


def test_the_copies_are_never_compressed_in_their_scope_index():
    """Sparse vectors (one component in eight; the hashing embedder's have many zeros)
    compress to a fraction of their 16-bit copy: a btree compresses a column of more
    than 512 bytes of an index tuple unless it is stored plain, and every exact ranking
    then decompressed each copy it read (17 ms for 10,000 copies instead of 4). Stored
    plain (knowledge 0020, memories 0023): the scope index holds every copy's 776 bytes."""
    for table in ("knowledge_chunk_half", "memories_fact_half"):
        assert (_storage(table), _storage(f"{table}_scope")) == ("p", "p")
    rng = np.random.default_rng(4)
    sparse = unit(rng, 300) * (rng.random((300, 384)) < 0.125)
    sparse /= np.linalg.norm(sparse, axis=1, keepdims=True)
    kb = base(UserFactory(username="alice"), "sparse")
    write(kb, sparse)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_relation_size('knowledge_chunk_half_scope')")
        size = cur.fetchone()[0]
        cur.execute(
            "SELECT count(*), min(pg_column_size(half)) FROM knowledge_chunk_half"
            " WHERE knowledge_base_id = %s",
            [kb.pk],
        )
        assert cur.fetchone() == (300, 776)
    assert size >= 300 * 776
