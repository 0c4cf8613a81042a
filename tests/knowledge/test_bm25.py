"""BM25 term statistics (kept by triggers) and the ranking and context built on them."""

from __future__ import annotations

import math
import random
import re
from dataclasses import replace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from knowledge import search
from knowledge.retrieval import bm25
from knowledge.retrieval.bm25 import candidate_query
from knowledge.retrieval.engine import Scope
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


def test_unchanged_rows_and_the_indexer_write_no_statistics(alice):
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


def test_a_hits_neighbours_in_its_session_earn_context(alice, monkeypatch):
    assert (search.CHUNKS.context.weight, search.CHUNKS.context.window) == (0.6, 2)
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
    # The answer holds no query word; it borrows 0.6 x its best neighbour's score one
    # step away and 0.36 x the best two steps away, combined so that a score stays <= 1:
    # 1 - (1 - own) x (1 - 0.6 x one step) x (1 - 0.36 x two steps).
    assert answer.keyword_rank is None
    monkeypatch.setattr(search, "CHUNKS", replace(search.CHUNKS, context=None))
    plain = {
        h.metadata["source_key"]: h.score
        for h in search_chunks(bases=[kb], request=SearchRequest(query="pets", top_k=4))
    }
    assert answer.score == pytest.approx(
        1 - (1 - plain["t3#0"]) * (1 - 0.6 * plain["t2#0"]) * (1 - 0.36 * plain["t1#0"])
    )
    assert question.score == pytest.approx(
        1 - (1 - plain["t2#0"]) * (1 - 0.6 * max(plain["t1#0"], plain["t3#0"]))
    )
    assert question.score == 1.0 and all(0 <= h.score <= 1 for h in hits)
    # Different session: not a neighbour of t3.
    assert by_key["t4#0"].score == pytest.approx(plain["t4#0"])


def test_a_neighbour_outside_the_filters_is_not_returned(alice, monkeypatch):
    monkeypatch.setattr(search, "SCALED", 1)
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


# --- pruning (knowledge/bm25.py) and context in SQL --------------------------------------
_WORDS = [f"w{i:03d}x" for i in range(120)]  # no stemming changes these


def _zipf_corpus(kb, n: int, seed: int, repeat: bool) -> None:
    """``n`` chunks of 4-12 words with Zipfian frequencies (no word twice unless ``repeat``),
    over 6 sessions in order."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(_WORDS))]
    docs = []
    for i in range(n):
        words = rng.choices(_WORDS, weights, k=rng.randint(4, 12))
        if not repeat:
            words = list(dict.fromkeys(words))
        docs.append(
            (
                f"d{i:04d}",
                " ".join(words),
                {
                    "session_id": f"s{i % 6}",
                    "timestamp": f"2025-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
                },
            )
        )
    ingest(kb, *docs)


def _queries(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(_WORDS))]
    return [" ".join(rng.choices(_WORDS, weights, k=rng.randint(2, 5))) for _ in range(count)]


def _rank(kb, query: str, limit: int, prune: bool) -> list[tuple[int, float]]:
    """The keyword leg of ``kb`` for ``query``: pruned (PRUNE_MIN_ROWS patched to 0 by the
    tests), or every match ranked in one statement (as for a filtered scope)."""
    kb.refresh_from_db()
    scope = Scope("knowledge_base_id = ANY(%s::uuid[])", [[str(kb.pk)]], kb.chunk_count)
    leg = bm25.chunk_leg([str(kb.pk)], "english", query, scope, limit, filtered=not prune)
    return [(row[0], float(row[1])) for row in leg.run()]


def test_candidate_query_holds_the_minimal_term_sets_that_reach_theta():
    lexemes, bounds = ["a", "b", "c", "d"], [5.0, 3.0, 2.0, 1.0]
    assert candidate_query(lexemes, bounds, 4.5) == "('a') | ('b' & 'c')"
    assert candidate_query(lexemes, bounds, 0.0) == "'a' | 'b' | 'c' | 'd'"
    assert candidate_query(lexemes, bounds, 6.5) == "('a' & 'b') | ('a' & 'c')"
    assert candidate_query(["it's", "a\\b"], [2.0, 1.0], 0) == "'it''s' | 'a\\\\b'"


def test_pruned_ranking_is_the_ranking_of_every_match(alice, monkeypatch):
    """Pruned (one statement or two) and unpruned keyword legs return the same ids and
    scores; the pruned one reads fewer chunks."""
    monkeypatch.setattr(bm25, "PRUNE_MIN_ROWS", 0)
    kb = make_kb(alice)
    _zipf_corpus(kb, 600, seed=3, repeat=True)
    statements, pruned_queries = [], 0
    original = bm25.fetch

    def recording(sql, params, prepare=True, local=None):
        if "bound AS MATERIALIZED" in sql:
            statements.append(" ".join(p for p in params if isinstance(p, str)))
        return original(sql, params, prepare, local)

    monkeypatch.setattr(bm25, "fetch", recording)
    for margin in (2.0, 0.05):  # 0.05: the guess is too high, a second statement follows
        monkeypatch.setattr(bm25, "PRUNE_MARGIN", margin)
        second = 0
        for query in _queries(seed=margin == 2.0, count=40):
            for limit in (3, 10):
                full = _rank(kb, query, limit, False)
                statements.clear()
                got = _rank(kb, query, limit, True)
                # (The unpruned ranking is one statement computing idf in SQL: the
                # scores may differ in their last bits.)
                assert [c for c, _ in got] == [c for c, _ in full], query
                assert [s for _, s in got] == pytest.approx([s for _, s in full], rel=1e-12)
                pruned_queries += any("&" in s for s in statements)
                second += len(statements) == 2
        assert second if margin < 1 else True
    assert pruned_queries > 20


_COMMON = _WORDS[:12]


def _common_corpus(kb, n: int, seed: int) -> None:
    """``n`` chunks of 6-30 words drawn from 12 (words repeat): most chunks hold most
    words, as in a base whose queries are made of its commonest words."""
    rng = random.Random(seed)
    ingest(kb, *((f"c{i:04d}", " ".join(rng.choices(_COMMON, k=rng.randint(6, 30))))
                 for i in range(n)))  # fmt: skip
    ingest(kb, *((f"r{i}", f"{_WORDS[60]} {' '.join(_COMMON[:6])}") for i in range(4)))


def _one_sql(kb, query: str, limit: int, probe: bool) -> tuple[str, list]:
    """The keyword leg's one statement over ``kb`` (its parameters too)."""
    kb_ids = [str(kb.pk)]
    return bm25.one_statement_sql(
        "english", query, "knowledge_base_id = ANY(%s::uuid[])", [kb_ids], kb_ids, limit,
        bm25.scope_tokens(kb_ids), probe,
    )  # fmt: skip


def _one_statement(kb, query: str, limit: int, probe: bool) -> list[tuple[int, float]]:
    sql, params = _one_sql(kb, query, limit, probe)
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [(row[0], float(row[1])) for row in cur.fetchall()]


def _probe_path(kb, query: str, limit: int) -> str:
    """Which way the probed statement went: ``none`` (no probe), ``short`` (fewer chunks
    hold every term than are ranked), ``all`` (the probe is the answer), ``sets`` (the
    minimal sets read) or ``every`` (too many sets: every match read)."""
    sql, params = _one_sql(kb, query, limit, True)
    head = sql[: sql.rindex("SELECT c.id, sum(")]
    probe = (
        "SELECT (SELECT aq IS NOT NULL FROM t), (SELECT count(*) FROM th),"
        " (SELECT whole FROM cq), (SELECT q IS NOT NULL FROM cq)"
    )
    with connection.cursor() as cur:
        cur.execute(head + probe, params[:-1])
        probed, found, whole, sets = cur.fetchone()
    if not probed:
        return "none"
    if not found:
        return "short"
    return "all" if whole else ("sets" if sets else "every")


def test_a_probed_statement_ranks_as_ranking_every_match(alice, monkeypatch):
    """The one statement's pruning of common terms (``_PROBED_C``) returns the ids and
    scores of ranking every match, whichever way it goes."""
    kb = make_kb(alice)
    _common_corpus(kb, 300, seed=7)
    rng = random.Random(8)
    queries = [" ".join(rng.sample(_COMMON, k)) for k in range(1, 13) for _ in range(3)]
    queries += [f"{_WORDS[60]} {_COMMON[0]}", f"{_WORDS[60]} {_COMMON[1]}", "nothing here"]
    paths = []
    for margin in (1.0, 0.01):  # 0.01: probes that find too few chunks
        monkeypatch.setattr(bm25, "PROBE_MARGIN", margin)
        for query in queries:
            for limit in (3, 10):
                want = _one_statement(kb, query, limit, probe=False)
                assert _one_statement(kb, query, limit, probe=True) == want, query
                paths.append(_probe_path(kb, query, limit))
    assert {p: paths.count(p) > 3 for p in set(paths)} == dict.fromkeys(
        ("none", "short", "all", "sets", "every"), True
    )


def test_the_term_sets_function_matches_the_python_sets(alice, monkeypatch):
    """``knowledge_bm25_sets`` (migration 0021) gives the minimal sets the 100,000-chunk
    path builds in Python (``_minimal_sets``), and none where it gives none (too many
    sets, or too many terms in them)."""
    rng = random.Random(4)
    for max_sets, max_terms in ((64, 100), (5, 12)):
        monkeypatch.setattr(bm25, "PRUNE_MAX_SETS", max_sets)
        monkeypatch.setattr(bm25, "PRUNE_MAX_SET_TERMS", max_terms)
        for _ in range(60):
            n = rng.randint(1, 12)
            lexemes = [f"t{i}" for i in range(n)]
            idf = sorted((rng.uniform(0.1, 5) for _ in range(n)), reverse=True)
            theta = rng.uniform(0, sum(idf) * 1.1) / 2.0
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT sets::text, all_terms FROM knowledge_bm25_sets("
                    "%s::text[], %s::float8[], 2.0, %s, %s, %s)",
                    [[f"'{x}'" for x in lexemes], idf, theta, max_sets, max_terms],
                )
                sets, whole = cur.fetchone()
            want = bm25._minimal_sets([x / 2.0 for x in idf], theta)
            if want is None or not want:  # (too many, or none reaches theta)
                assert sets is None, (idf, theta)
                continue
            clauses = {frozenset(f"'{lexemes[i]}'" for i in c) for c in want}
            assert _clauses(sets) == clauses, (idf, theta)
            assert whole == (clauses == {frozenset(f"'{x}'" for x in lexemes)})


def _clauses(tsquery: str) -> set[frozenset[str]]:
    """An OR of ANDs as its sets of terms."""
    return {frozenset(c.strip("() ").split(" & ")) for c in tsquery.split(" | ")}


def test_pruned_ranking_is_exact_bm25_when_no_chunk_repeats_a_word(alice, monkeypatch):
    monkeypatch.setattr(bm25, "PRUNE_MIN_ROWS", 0)
    kb = make_kb(alice)
    _zipf_corpus(kb, 400, seed=5, repeat=False)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, tsvector_to_array(search_vector) FROM knowledge_chunk "
            "WHERE knowledge_base_id = %s",
            [kb.pk],
        )
        chunks = {cid: set(lexemes) for cid, lexemes in cur.fetchall()}
    n, avgdl = len(chunks), sum(map(len, chunks.values())) / len(chunks)
    df = {w: sum(w in c for c in chunks.values()) for w in _WORDS}
    k1, b = 1.2, 0.3

    def exact(query: str, limit: int) -> list[tuple[int, float]]:
        terms = set(query.split())
        scores = {
            cid: sum(
                math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                * (k1 + 1)
                / (1 + k1 * (1 - b + b * len(lexemes) / avgdl))
                for t in terms & lexemes
            )
            for cid, lexemes in chunks.items()
            if terms & lexemes
        }
        return sorted(scores.items(), key=lambda r: (-r[1], r[0]))[:limit]

    for query in _queries(seed=11, count=30):
        want = exact(query, 10)
        got = _rank(kb, query, 10, True)
        assert [cid for cid, _ in got] == [cid for cid, _ in want], query
        assert [s for _, s in got] == pytest.approx([s for _, s in want])


def _prepared_statements() -> list[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cur.fetchall()]


def test_search_statements_are_prepared_once_per_connection(alice):
    """Prepared on first use on a connection and reused; the query vector goes as a
    parameter (binary), never as text in the statement."""
    kb = make_kb(alice)
    ingest(kb, ("a", "harbour cranes"), ("b", "harbour ships"))
    for query in ("harbour cranes", "harbour ships", "cranes ships"):  # (as many words)
        search_chunks(bases=[kb], request=SearchRequest(query=query, top_k=2))
    statements = _prepared_statements()
    assert sum(s.startswith("/* chunks search */") for s in statements) == 1
    assert not any(re.search(r"\[-?\d+\.\d+(e-?\d+)?,", s) for s in statements)


def test_a_small_base_is_searched_by_one_prepared_statement(alice):
    kb = make_kb(alice)
    ingest(kb, ("a", "harbour cranes"), ("b", "harbour ships"))
    with CaptureQueriesContext(connection) as ctx:
        for _ in range(3):
            search_chunks(bases=[kb], request=SearchRequest(query="harbour cranes", top_k=2))
    assert len(ctx.captured_queries) == 3  # one statement per search
    statements = _prepared_statements()
    assert [s.split("*/")[0] for s in statements] == ["/* chunks search "]
