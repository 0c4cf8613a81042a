"""The keyword leg finds a scope's matches in one text-index lookup: the index holds each
chunk's base and session as tokens (migration 0012, ``knowledge.bm25.SCOPED_TEXT``)."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from knowledge import search
from knowledge.retrieval import bm25
from knowledge.retrieval.engine import Scope
from knowledge.search import SearchRequest, search_chunks
from tests.factories import UserFactory
from tests.knowledge.factories import ingest, make_kb

# Session ids a token must keep apart: a prefix of another, quotes, a backslash, spaces,
# tsquery operators, the empty one (chunks without a session).
SESSIONS = ["s1", "s1 x", "it's", "back\\slash", "", "ünï côdé", "a:b & c|d !e", "kb x"]
WORDS = ["harbour", "orchard", "quarry"]


def _corpus(kb, tag: str) -> dict[int, tuple[str, str]]:
    docs = [
        (f"{tag}-{i}", f"{WORDS[i % 3]} {WORDS[(i + 1) % 3]} note {tag}", {"session_id": session})
        for i, session in enumerate(SESSIONS * 2)
    ]
    ingest(kb, *docs)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, session_id, text FROM knowledge_chunk WHERE knowledge_base_id = %s",
            [kb.pk],
        )
        return {row[0]: (row[1], row[2]) for row in cur.fetchall()}


def _expected(chunks, session: str | None, word: str) -> set[int]:
    return {
        cid
        for cid, (s, text) in chunks.items()
        if (session is None or s == session) and word in text.split()
    }


@pytest.mark.parametrize("prune", [False, True])
def test_keyword_matches_stay_in_their_scope(alice, monkeypatch, prune):
    """Unpruned (one statement) and pruned: every match of the scope comes back and
    nothing outside it, for one base, two bases, and each awkward session id."""
    monkeypatch.setattr(bm25, "PRUNE_MIN_ROWS", 0 if prune else 10**9)
    first, second = make_kb(alice), make_kb(alice, name="second")
    other = make_kb(UserFactory(username="olga"))
    chunks = {kb.pk: _corpus(kb, tag) for kb, tag in ((first, "a"), (second, "b"), (other, "c"))}
    checked = 0
    for word in WORDS:
        for bases in ([first], [first, second]):
            ids = [str(kb.pk) for kb in bases]
            for session in [None, *SESSIONS]:
                filters = {} if session is None else {"session_id": session}
                request = SearchRequest(query=word, filters=filters)
                sql, params = search._scope(ids, request)
                leg = bm25.chunk_leg(
                    ids, "english", word, Scope(sql, params, None if session else 10**6), 100,
                    filtered=session is not None, session_id=session,
                )  # fmt: skip
                got = leg.run()
                want = set().union(*(_expected(chunks[kb.pk], session, word) for kb in bases))
                assert {row[0] for row in got} == want, (word, len(bases), session)
                checked += len(want)
    assert checked > 100


def test_a_hybrid_search_filtered_to_a_session_keeps_to_it(alice):
    kb = make_kb(alice)
    chunks = _corpus(kb, "a")
    for session in SESSIONS:
        request = SearchRequest(query="orchard quarry", top_k=50, filters={"session_id": session})
        hits = search_chunks(bases=[kb], request=request)
        assert {h.chunk_id for h in hits} == {c for c, (s, _) in chunks.items() if s == session}
        assert all(h.keyword_rank is not None for h in hits)


def test_the_keyword_leg_reads_the_scoped_text_index_only(alice):
    """The statement's match condition is the index's expression (else the index could
    not serve it), and no b-tree index is ANDed in."""
    kb = make_kb(alice)
    _corpus(kb, "a")
    request = SearchRequest(query="harbour", filters={"session_id": "s1"})
    leg = bm25.chunk_leg(
        [str(kb.pk)], "english", "harbour", search._scope_of([kb], request), 10, True, "s1"
    )
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN " + leg.sql, leg.params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    scans = re.findall(
        r"Index Scan on (\w+)|Index Scan using (\w+)|Index Only Scan using (\w+)", plan
    )
    used = {name for scan in scans for name in scan if name}
    assert "chunk_scoped_text_gin" in used, plan
    assert not any(name.startswith("knowledge_chunk_knowledge_base_id") for name in used), plan
    assert "chunk_kb_session_order" not in used, plan


def test_a_sessions_token_matches_that_session_only(db):
    """Each session id's token query, as the server parses it, matches the token the index
    holds for that session and for no other."""
    with connection.cursor() as cur:
        for session in SESSIONS:
            for other in SESSIONS:
                cur.execute(
                    "SELECT array_to_tsvector(ARRAY['se b1 ' || %s]) @@ %s::tsquery",
                    [other, bm25.scope_tokens(["b1"], session)],
                )
                assert cur.fetchone()[0] == (other == session), (session, other)
        cur.execute(
            "SELECT array_to_tsvector(ARRAY['kb b2']) @@ %s::tsquery",
            [bm25.scope_tokens(["b1", "b2"])],
        )
        assert cur.fetchone()[0] is True
