"""A hybrid search in one statement gives what its legs run apart give, in one round trip,
and leaves no setting behind (knowledge.search._one_statement_sql)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from knowledge import search
from knowledge.search import SearchRequest, search_chunks
from knowledge.services import knowledge_index_pending
from tests.factories import UserFactory
from tests.knowledge.factories import make_kb
from tests.knowledge.test_bm25 import _queries, _zipf_corpus

REQUESTS = [
    {},
    {"filters": {"session_id": "s2"}},
    {"since": datetime(2025, 1, 1, 0, 1, tzinfo=UTC)},
    {"similarity_threshold": 0.05},
    {"filters": {"session_id": "s4"}, "similarity_threshold": 0.02},
]


def _both_ways(kb, settings, query: str, top_k: int, extra: dict):
    request = SearchRequest(query=query, top_k=top_k, **extra)
    assert search._one_statement_sql([kb], request) is not None
    settings.SEARCH_ONE_STATEMENT = True
    one = [vars(h) for h in search_chunks(bases=[kb], request=request)]
    settings.SEARCH_ONE_STATEMENT = False
    apart = [vars(h) for h in search_chunks(bases=[kb], request=request)]
    settings.SEARCH_ONE_STATEMENT = True
    return one, apart


@pytest.mark.parametrize("path", ["exact", "index"])
def test_one_statement_ranks_as_the_legs_apart(alice, settings, path):
    """Same hits, in the same order, with the same scores, ranks, text and metadata (exact
    float equality), on the exact path (a small base) and the index path (HNSW and the
    rows it has not reached yet), unfiltered, filtered, with a time range or a threshold."""
    if path == "index":
        settings.SEARCH_EXACT_MAX_ROWS = 0
    kb = make_kb(alice)
    _zipf_corpus(kb, 240, seed=5, repeat=True)
    if path == "index":
        knowledge_index_pending()  # most rows in the HNSW index, some left pending
        _zipf_corpus(kb, 260, seed=6, repeat=True)
        kb.refresh_from_db()
    checked = 0
    for query in _queries(seed=17, count=8):
        for top_k in (1, 5, 10):
            for extra in REQUESTS:
                one, apart = _both_ways(kb, settings, query, top_k, extra)
                assert one == apart, (query, top_k, extra)
                checked += bool(one)
    assert checked > 100


def test_other_searches_keep_their_legs(alice, settings):
    kb = make_kb(alice)
    _zipf_corpus(kb, 20, seed=5, repeat=False)
    query = _queries(seed=17, count=1)[0]
    assert search._one_statement_sql([kb], SearchRequest(query=query)) is not None
    for request in (
        SearchRequest(query=query, mode="vector"),
        SearchRequest(query=query, rrf_k=60),
        SearchRequest(query=query, half_life_days=30.0),
        SearchRequest(query="?!", vector=[0.1] * kb.embedding_dimensions),
    ):
        assert search._one_statement_sql([kb], request) is None
    settings.SEARCH_CONTEXT_WEIGHT = 0
    assert search._one_statement_sql([kb], SearchRequest(query=query)) is None
    settings.SEARCH_CONTEXT_WEIGHT = 0.5
    settings.SEARCH_ONE_STATEMENT = False
    assert search._one_statement_sql([kb], SearchRequest(query=query)) is None


def _setting(name: str) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting(%s)", [name])
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "exact_max_rows,filters", [(10_000, {}), (0, {}), (0, {"session_id": "s2"})]
)
def test_a_search_is_one_round_trip_and_its_settings_end_with_it(settings, exact_max_rows, filters):
    """Outside a transaction: one statement, sent with its settings in one pipeline
    (prepared, with a generic plan, filtered or not; HNSW settings
    on the index path); none of them left on the connection afterwards. (The index's row
    count, cached for minutes, is read before: a first search.)"""
    settings.SEARCH_EXACT_MAX_ROWS = exact_max_rows
    kb = make_kb(UserFactory(username=f"rita{exact_max_rows}{len(filters)}"))
    _zipf_corpus(kb, 60, seed=8, repeat=True)
    knowledge_index_pending()
    kb.refresh_from_db()
    before = {name: _setting(name) for name in ("plan_cache_mode", "hnsw.ef_search")}
    query = _queries(seed=3, count=1)[0]
    request = SearchRequest(query=query, top_k=5, filters=filters)
    search_chunks(bases=[kb], request=request)
    with CaptureQueriesContext(connection) as ctx:
        hits = search_chunks(bases=[kb], request=request)
    assert len(hits) == 5
    [statement] = [q["sql"] for q in ctx.captured_queries]
    kind = "filtered" if filters else "small scope" if exact_max_rows else "index"
    assert statement.startswith(f"/* hybrid, {kind} */")
    assert ("chunk_hnsw" in statement or "halfvec" in statement) == (not exact_max_rows)
    assert {name: _setting(name) for name in before} == before
    assert before["plan_cache_mode"] == "auto"


def test_the_chunk_index_is_built_on_halfvec(db):
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indrelid = 'knowledge_chunk'::regclass AND indexrelid::regclass::text "
            "LIKE 'chunk_hnsw%%'"
        )
        indexes = dict(cur.fetchall())
    assert set(indexes) == {
        "chunk_hnsw_half_384",
        "chunk_hnsw_half_768",
        "chunk_hnsw_half_1024",
        "chunk_hnsw_half_1536",
    }
    assert "halfvec_cosine_ops" in indexes["chunk_hnsw_half_384"]
    assert "NOT index_pending" in indexes["chunk_hnsw_half_384"]


def _split_and_one(kb, settings, query: str, top_k: int, extra: dict):
    request = SearchRequest(query=query, top_k=top_k, **extra)
    settings.SEARCH_SPLIT_MIN_ROWS = 0
    assert search._one_statement_sql([kb], request).split is not None
    with CaptureQueriesContext(connection) as ctx:
        split = [vars(h) for h in search_chunks(bases=[kb], request=request)]
    settings.SEARCH_SPLIT_MIN_ROWS = 10**9
    assert search._one_statement_sql([kb], request).split is None
    one = [vars(h) for h in search_chunks(bases=[kb], request=request)]
    return split, one, [q["sql"][:20] for q in ctx.captured_queries]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["exact", "index"])
def test_split_legs_rank_as_the_one_statement(settings, path):
    """From SEARCH_SPLIT_MIN_ROWS chunks, outside transactions, the statement's vector leg
    runs here while its keyword leg runs on a pool thread's connection, then a third
    statement fuses them: the same hits, order, scores, ranks, text and metadata (exact
    float equality) as the one statement, whatever the filters; this connection sees the
    vector leg and the fusion, and no setting is left on it."""
    if path == "index":
        settings.SEARCH_EXACT_MAX_ROWS = 0
    kb = make_kb(UserFactory(username=f"sam{path}"))
    _zipf_corpus(kb, 240, seed=5, repeat=True)
    if path == "index":
        knowledge_index_pending()
        _zipf_corpus(kb, 260, seed=6, repeat=True)
    kb.refresh_from_db()
    search_chunks(bases=[kb], request=SearchRequest(query="alpha"))  # (loads pgvector's settings)
    before = {name: _setting(name) for name in ("plan_cache_mode", "hnsw.ef_search")}
    checked = 0
    for query in _queries(seed=23, count=6):
        for top_k in (1, 10):
            for extra in REQUESTS:
                split, one, statements = _split_and_one(kb, settings, query, top_k, extra)
                assert split == one, (query, top_k, extra)
                assert [s.split(" */")[0] for s in statements] == [
                    "/* vector leg, " + statements[0].split(", ")[1].split(" */")[0],
                    "/* fused legs",
                ]
                checked += bool(split)
    assert checked > 40
    assert {name: _setting(name) for name in before} == before


@pytest.mark.django_db(transaction=True)
def test_no_split_inside_a_transaction(settings):
    """Inside a transaction the other connection would not see its writes: one statement."""
    settings.SEARCH_SPLIT_MIN_ROWS = 0
    kb = make_kb(UserFactory(username="tess"))
    _zipf_corpus(kb, 30, seed=5, repeat=True)
    kb.refresh_from_db()
    query = _queries(seed=3, count=1)[0]
    assert search._one_statement_sql([kb], SearchRequest(query=query)).split is not None
    with transaction.atomic():
        assert search._one_statement_sql([kb], SearchRequest(query=query)).split is None
    settings.SEARCH_PARALLEL_LEGS = False
    assert search._one_statement_sql([kb], SearchRequest(query=query)).split is None


@pytest.mark.django_db(transaction=True)
def test_a_filtered_vector_legs_generic_plan_takes_the_hnsw_index(settings):
    """The split vector leg is planned once for any values (a generic plan): for a scope
    too large for an exact scan, its index CTE must take the HNSW index, which it does
    because its scope is written so that no b-tree index can serve it. (Sequential scans
    are off here: on a table this small the planner would rather sort it all, as it
    would not on a large one.)"""
    settings.SEARCH_EXACT_MAX_ROWS = 0
    settings.SEARCH_SPLIT_MIN_ROWS = 0
    kb = make_kb(UserFactory(username="uma"))
    _zipf_corpus(kb, 300, seed=5, repeat=True)
    knowledge_index_pending()
    kb.refresh_from_db()
    with connection.cursor() as cur:
        cur.execute("ANALYZE knowledge_chunk")  # (the planner knows the session is small)
    request = SearchRequest(query="alpha", filters={"session_id": "s2"})
    sql, params, local, prepare = search._one_statement_sql([kb], request).split.vector
    assert ("plan_cache_mode", "force_generic_plan") in local and prepare
    numbered = iter(range(1, 1000))
    generic = re.sub(r"%s", lambda m: f"${next(numbered)}", sql)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN (GENERIC_PLAN) " + generic.replace("%%", "%"))
        plan = "\n".join(row[0] for row in cur.fetchall())
    index_cte = plan.split("CTE i\n")[1].split("CTE p\n")[0]
    assert "chunk_hnsw_half_384" in index_cte, plan
