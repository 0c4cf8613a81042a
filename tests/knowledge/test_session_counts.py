"""Each (base, session)'s chunks counted by the database (``knowledge_session_stats``,
migration 0019) on every chunk write, and a search filtered to a session only reading
that count where it counted the session's rows: the same hits either way."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from django.db import connection

from core.db_backend.base import table_owner
from knowledge import search
from knowledge.models import Chunk
from knowledge.search import SearchRequest, search_chunks
from knowledge.services import knowledge_base_delete, knowledge_base_delete_chunks
from tests.factories import UserFactory
from tests.knowledge.factories import ingest, make_kb
from tests.knowledge.test_chunk_half import T0, base, unit, write

pytestmark = pytest.mark.django_db


def counted() -> dict[tuple, int]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT knowledge_base_id, session_id, owner_id, chunks FROM knowledge_session_stats"
        )
        return {tuple(row[:3]): row[3] for row in cur.fetchall()}


def actual() -> dict[tuple, int]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT knowledge_base_id, session_id, owner_id, count(*) FROM knowledge_chunk "
            "GROUP BY 1, 2, 3"
        )
        return {tuple(row[:3]): row[3] for row in cur.fetchall()}


def test_the_counts_follow_every_chunk_write():
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    rng = np.random.default_rng(3)
    a, b = base(alice, "a"), base(bob, "b")
    made = write(a, unit(rng, 9), sessions=3)
    write(b, unit(rng, 4), sessions=2)
    assert counted() == actual() and len(counted()) == 5
    assert counted()[(a.pk, "s0", alice.pk)] == 3

    # Moved to another session (one, then several at once), edited in place, deleted.
    Chunk.objects.filter(pk=made[0].pk).update(session_id="s9")
    Chunk.objects.filter(pk__in=[made[1].pk, made[2].pk]).update(session_id="s0")
    Chunk.objects.filter(pk=made[4].pk).update(text="edited", metadata={"k": 1})
    assert counted() == actual()
    assert counted()[(a.pk, "s9", alice.pk)] == 1 and counted()[(a.pk, "s0", alice.pk)] == 4
    Chunk.objects.filter(session_id="s2", knowledge_base=a).delete()  # (its last chunks)
    assert counted() == actual() and (a.pk, "s2", alice.pk) not in counted()

    # Through the ingest service (its upsert), its deletes by session, and a base's delete.
    docs = make_kb(alice, "docs")
    ingest(docs, ("x", "one", {"session_id": "t1"}), ("y", "two", {"session_id": "t1"}),
           ("z", "three"))  # fmt: skip
    ingest(docs, ("x", "one, now longer", {"session_id": "t2"}))
    assert counted() == actual()
    assert counted()[(docs.pk, "t1", alice.pk)] == 1 and counted()[(docs.pk, "", alice.pk)] == 1
    knowledge_base_delete_chunks(knowledge_base=docs, session_id="t2")
    knowledge_base_delete(knowledge_base=a)
    assert counted() == actual() and not any(key[0] == a.pk for key in counted())


@pytest.mark.django_db(transaction=True)
def test_a_truncate_of_the_chunks_empties_the_counts():
    write(base(UserFactory(username="alice"), "a"), unit(np.random.default_rng(4), 3))
    with table_owner(connection), connection.cursor() as cur:  # (TRUNCATE: the owner's)
        cur.execute("TRUNCATE knowledge_chunk CASCADE")
        cur.execute("SELECT count(*) FROM knowledge_session_stats")
        assert cur.fetchone()[0] == 0


def test_a_session_search_reads_the_count_and_finds_what_counting_found(monkeypatch):
    """Exact or walk by the session's size (exact_max 5 here): a session of 4 chunks is
    ranked exactly, one of 40 walks (the shares of the table allowed for neither), each
    deciding from the counter; counting the rows instead decides the same, with the same
    hits; a search with another filter or a time range still counts."""
    alice = UserFactory(username="alice")
    rng = np.random.default_rng(6)
    kb = base(alice, "turns")
    write(kb, unit(rng, 40), sessions=1, prefix="long")
    write(kb, unit(rng, 4), sessions=1, prefix="short")  # (session "s0" too: 44 rows)
    Chunk.objects.filter(source_key__startswith="short").update(session_id="s-short")
    tuned = replace(search.CHUNKS, exact_max=5, walk_min_share=0.0)
    monkeypatch.setattr(search, "CHUNKS", tuned)
    q = unit(rng, 1)[0].tolist()
    for session, path in (("s-short", "exact"), ("s0", "walk")):
        request = SearchRequest(query="tea", vector=q, top_k=10, filters={"session_id": session})
        leg = search._vector_leg([kb], request, 10)
        assert "FROM knowledge_session_stats" in leg.sql and leg.path == "filtered"
        assert {row[2] for row in leg.run()} == {path == "walk"}  # (walked: from the index)
        by_counter = search_chunks(bases=[kb], request=request)
        monkeypatch.setattr(search, "_session_size", lambda kb_ids, request: None)
        assert "FROM knowledge_session_stats" not in search._vector_leg([kb], request, 50).sql
        by_counting = search_chunks(bases=[kb], request=request)
        monkeypatch.undo()
        monkeypatch.setattr(search, "CHUNKS", tuned)
        got = [(h.chunk_id, h.score) for h in by_counter]
        assert got == [(h.chunk_id, h.score) for h in by_counting]
        assert len(got) == (4 if session == "s-short" else 10)
    for filters, since in (
        ({"session_id": "s0", "flow_id": "f0"}, None),
        ({"session_id": "s0"}, T0),
    ):
        request = SearchRequest(vector=q, mode="vector", filters=filters, since=since)
        assert "knowledge_session_stats" not in search._vector_leg([kb], request, 50).sql
