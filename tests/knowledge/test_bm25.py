"""BM25 term statistics (kept by triggers) and the ranking and context built on them."""

from __future__ import annotations

import math

import pytest
from django.db import connection

from knowledge.search import SearchRequest, search_chunks
from knowledge.services import ingest as ingest_service
from knowledge.services import (
    knowledge_base_delete,
    knowledge_base_delete_chunks,
    knowledge_index_pending,
)
from tests.knowledge.factories import ingest, make_kb


def _stats(kb) -> tuple[dict[str, int], tuple[int, int] | None]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT lexeme, df FROM knowledge_term_stats WHERE knowledge_base_id = %s", [kb.pk]
        )
        terms = dict(cur.fetchall())
        cur.execute(
            "SELECT chunks, lexemes FROM knowledge_base_text_stats WHERE knowledge_base_id = %s",
            [kb.pk],
        )
        totals = cur.fetchone()
    return terms, totals


def _recounted(kb) -> tuple[dict[str, int], tuple[int, int] | None]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT u.lexeme, count(*) FROM knowledge_chunk c, unnest(c.search_vector) u "
            "WHERE c.knowledge_base_id = %s GROUP BY 1",
            [kb.pk],
        )
        terms = dict(cur.fetchall())
        cur.execute(
            "SELECT count(*), sum(length(search_vector)) FROM knowledge_chunk "
            "WHERE knowledge_base_id = %s HAVING count(*) > 0",
            [kb.pk],
        )
        totals = cur.fetchone()
    return terms, totals


def test_statistics_follow_ingest_reingest_and_deletes(alice):
    kb = make_kb(alice)
    other = make_kb(alice, name="other")
    ingest(other, ("x", "harbour cranes"))
    ingest(
        kb,
        ("a", "The harbour cranes were loading ships", {"session_id": "s1"}),
        ("b", "Ships leave the harbour at dawn", {"session_id": "s2"}),
        ("c", "Orchard apples", {"session_id": "s2"}),
    )
    terms, totals = _stats(kb)
    assert terms == {
        "harbour": 2,
        "crane": 1,
        "load": 1,
        "ship": 2,
        "leav": 1,
        "dawn": 1,
        "orchard": 1,
        "appl": 1,
    }
    assert totals == (3, 4 + 4 + 2)
    ingest(kb, ("a", "Quarry stones"))  # re-ingest with other words
    assert _stats(kb) == _recounted(kb)
    assert _stats(kb)[0]["harbour"] == 1 and "crane" not in _stats(kb)[0]
    knowledge_base_delete_chunks(knowledge_base=kb, session_id="s2")
    assert _stats(kb) == _recounted(kb) == ({"quarri": 1, "stone": 1}, (1, 2))
    knowledge_base_delete(knowledge_base=kb)
    assert _stats(kb) == ({}, None)
    assert _stats(other) == ({"harbour": 1, "crane": 1}, (1, 2))


def test_unchanged_rows_and_the_indexer_write_no_statistics(alice, settings):
    settings.KNOWLEDGE_DEFERRED_INDEXING = True
    kb = make_kb(alice)
    ingest(kb, ("a", "harbour cranes"), ("b", "harbour ships"))
    before = _stats(kb)
    ingest(kb, ("a", "harbour cranes"))  # same text again
    knowledge_index_pending()  # UPDATE ... SET index_pending = false
    assert _stats(kb) == before == ({"harbour": 2, "crane": 1, "ship": 1}, (2, 4))


def test_a_failed_write_leaves_the_statistics_as_they_were(alice, monkeypatch):
    kb = make_kb(alice)
    ingest(kb, ("kept", "harbour cranes"))
    before = _stats(kb)

    def explode(cur, kb, old, new):
        raise RuntimeError("crash after the upsert, before commit")

    monkeypatch.setattr(ingest_service, "_apply_stats_delta", explode)
    with pytest.raises(RuntimeError):
        ingest(kb, ("kept", "orchard apples"), ("new", "quarry stones"))
    assert _stats(kb) == before


def test_bm25_scores_rare_words_higher_and_stems(alice):
    kb = make_kb(alice)
    docs = [(f"d{i}", "weekly report") for i in range(8)]
    ingest(kb, *docs, ("rare", "zephyr report"), ("run", "She runs"))
    request = SearchRequest(query="zephyr reports", mode="keyword", top_k=3)
    hits = search_chunks(bases=[kb], request=request)
    assert hits[0].text == "zephyr report"
    n, avgdl, k1, b = 10, (8 * 2 + 2 + 1) / 10, 1.2, 0.3  # lengths in lexemes

    def term(df: int, dl: int) -> float:
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return idf * (k1 + 1) / (1 + k1 * (1 - b + b * dl / avgdl))

    assert hits[0].keyword_score == pytest.approx(term(1, 2) + term(9, 2))
    assert hits[1].keyword_score == pytest.approx(term(9, 2))  # "report" alone
    stemmed = search_chunks(bases=[kb], request=SearchRequest(query="running", mode="keyword"))
    assert [h.text for h in stemmed] == ["She runs"]


def test_a_hits_neighbours_in_its_session_earn_context(alice, settings):
    settings.SEARCH_CONTEXT_WEIGHT, settings.SEARCH_CONTEXT_WINDOW = 0.5, 2
    kb = make_kb(alice)
    turns = [
        ("t1", "Ann: Good morning!", {"session_id": "s", "sender": "ann"}),
        ("t2", "Ann: Which pets do you keep?", {"session_id": "s", "sender": "ann"}),
        ("t3", "Bob: Two cats, Luna and Oliver.", {"session_id": "s", "sender": "bob"}),
        ("t4", "Bob: Also a garden.", {"session_id": "other", "sender": "bob"}),
    ]
    ingest(kb, *turns)
    hits = search_chunks(bases=[kb], request=SearchRequest(query="pets", top_k=4))
    by_key = {h.metadata["source_key"]: h for h in hits}
    question, answer = by_key["t2#0"], by_key["t3#0"]
    assert hits[0] is question and question.keyword_rank == 1
    # The answer holds no query word; it earns 0.5 x its best neighbour's score one step
    # away and 0.25 x the best two steps away.
    assert answer.keyword_rank is None
    settings.SEARCH_CONTEXT_WEIGHT = 0.0
    plain = {
        h.metadata["source_key"]: h.score
        for h in search_chunks(bases=[kb], request=SearchRequest(query="pets", top_k=4))
    }
    assert answer.score == pytest.approx(plain["t3#0"] + 0.5 * plain["t2#0"] + 0.25 * plain["t1#0"])
    assert question.score == pytest.approx(plain["t2#0"] + 0.5 * max(plain["t1#0"], plain["t3#0"]))
    # Different session: not a neighbour of t3.
    assert by_key["t4#0"].score == pytest.approx(plain["t4#0"])


def test_a_neighbour_outside_the_filters_is_not_returned(alice, settings):
    settings.SEARCH_CONTEXT_WEIGHT, settings.SEARCH_CONTEXT_WINDOW = 0.5, 2
    settings.SEARCH_CANDIDATES = 1
    kb = make_kb(alice)
    ingest(
        kb,
        ("t1", "Ann: Which pets do you keep?", {"session_id": "s", "sender": "ann"}),
        ("t2", "Bob: Two cats, Luna and Oliver.", {"session_id": "s", "sender": "bob"}),
    )
    request = SearchRequest(query="pets", top_k=1, filters={"sender": "ann"}, mode="hybrid")
    hits = search_chunks(bases=[kb], request=request)
    assert [h.metadata["source_key"] for h in hits] == ["t1#0"]
    request = SearchRequest(query="pets", top_k=5, filters={"sender": "ann"})
    assert [h.metadata["source_key"] for h in search_chunks(bases=[kb], request=request)] == [
        "t1#0"
    ]
