"""The vector searches of a node's stores in one round trip: the same hits, in the same
order, as each store searching alone and as a brute-force ranking of every item; the
exact path below ``MEMORY_STORE_EXACT_MAX_ITEMS``, the halfvec HNSW index above it;
the bit-parallel longest common subsequence against the textbook one."""

from __future__ import annotations

import random
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from knowledge.models import Chunk
from knowledge.services import knowledge_index_pending
from memories.stores.backends import sql
from memories.stores.backends.base import QueryVectors, RetrieveQuery
from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryItem, MemoryStore
from memories.stores.runtime import node_memory_retrieve
from memories.stores.services import backend_for
from memories.stores.text import _lcs, key_content, lexical_score, summary_hash, words

pytestmark = pytest.mark.django_db

TOPICS = ["deploy", "invoice", "mentor", "weather", "museum", "database", "schedule", "train"]
FILLER = "the a of team week new old first last big small quick plan note".split()
QUERIES = ["deploy the database", "invoice for the museum", "train schedule next week", "x"]
NODE_N = [  # node ``n``'s attachments of the three simple stores
    {"name": "a", "top_k": 3},
    {"name": "b", "top_k": 2, "similarity_threshold": 0.15},
    {"name": "c", "top_k": 4},
]


def _fill(store: MemoryStore, n: int, rng: random.Random) -> None:
    embedder = backend_for(store).embedder()
    assert embedder is not None
    items = []
    for i in range(n):
        picked = rng.sample(TOPICS, 2) + rng.sample(FILLER, 4)
        summary = f"Input: question {i} Output: {' '.join(picked)} number {i}."
        items.append(
            MemoryItem(
                store=store,
                content_summary=summary,
                summary_hash=summary_hash(summary),
                embedding=embedder.embed([summary])[0],
            )
        )
    for item in items:
        item.dimensions = len(item.embedding)
    MemoryItem.objects.bulk_create(items)


@pytest.fixture
def stores(alice, flow) -> dict[str, MemoryStore]:
    """Three simple stores (two of 384 dimensions, one of 768: two query vectors) with
    60, 45 and 30 items, attached to node ``n`` with different top_k and thresholds."""
    memory_config_apply(
        owner=alice,
        document={
            "memory": [
                {"name": "a", "type": "simple", "config": {}},
                {"name": "b", "type": "simple", "config": {"rerank_weight": 0.5}},
                {
                    "name": "c",
                    "type": "simple",
                    "config": {"embedding": {"provider": "hashing", "params": {"dimensions": 768}}},
                },
            ],
            "nodes": [
                {
                    "id": "n",
                    "flow": flow.name,
                    "memories": NODE_N,
                }
            ],
        },
    )
    found = {s.name: s for s in MemoryStore.objects.filter(owner=alice)}
    rng = random.Random(7)
    for name, n in (("a", 60), ("b", 45), ("c", 30)):
        _fill(found[name], n, rng)
    sql._sizes.clear()
    return found


def _reference(store: MemoryStore, query: str, top_k: int, threshold: float) -> list[str]:
    """The simple store's answer computed the long way: every item's exact distance
    (pgvector's arithmetic), the top_k x 3 nearest by (distance, id), the threshold,
    the lexical rerank."""
    backend = backend_for(store)
    text = key_content(query, max_chars=backend.config["max_content_length"])
    vector = backend.embedder().embed([text])[0]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, content_summary, embedding <=> %s::vector FROM "
            "memory_stores_memoryitem WHERE store_id = %s",
            [sql.vector_literal(vector), store.pk],
        )
        rows = sorted(cur.fetchall(), key=lambda r: (r[2], r[0]))[: top_k * 3]
    if threshold > -1:
        rows = [r for r in rows if 1.0 - r[2] >= threshold - 1e-9]
    weight = backend.config["rerank_weight"]
    scored = [
        ((1 - weight) * (1 - d) + weight * lexical_score(words(text), words(s)), i)
        for i, s, d in rows
    ]
    return [str(i) for _, i in sorted(scored, key=lambda x: (-x[0], x[1]))[:top_k]]


def _alone(store: MemoryStore, query: str, top_k: int, threshold: float) -> list[str]:
    request = RetrieveQuery(query, top_k, threshold, "", QueryVectors(query))  # no batch
    return [h.id for h in backend_for(store).retrieve(request)]


SETUP = {"a": (3, -1.0), "b": (2, 0.15), "c": (4, -1.0)}


@pytest.mark.parametrize("path", ["exact", "index"])
def test_one_round_trip_gives_each_store_its_own_answer(stores, flow, settings, path):
    queries = QUERIES
    if path == "index":
        settings.MEMORY_STORE_EXACT_MAX_ITEMS = 10  # every store: the HNSW index
        # "x" shares no word with any item: every distance ties, and which of the tied
        # items an approximate index finds first is its own business.
        queries = QUERIES[:3]
    for query in queries:
        with CaptureQueriesContext(connection) as captured:
            result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=query)
        searches = [q["sql"] for q in captured.captured_queries if "UNION ALL" in q["sql"]]
        assert len(searches) == 1  # the three stores' searches: one query string
        assert searches[0].count("::vector AS v") == 2  # 384 and 768: each vector once
        assert ("::halfvec(" in searches[0]) is (path == "index")
        got = {g.store: [h.id for h in g.hits] for g in result.stores}
        for name, (top_k, threshold) in SETUP.items():
            expected = _reference(stores[name], query, top_k, threshold)
            assert got[name] == expected, (query, name)
            assert _alone(stores[name], query, top_k, threshold) == expected
        similarities = [h.similarity for g in result.stores for h in g.hits]
        assert all(s is not None and -1.0 <= s <= 1.0 for s in similarities)


def test_distances_are_the_exact_ones_on_the_index_path(stores, flow, settings):
    exact = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[0])
    settings.MEMORY_STORE_EXACT_MAX_ITEMS = 10
    sql._sizes.clear()
    indexed = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[0])
    pairs = lambda r: [[(h.id, h.similarity, h.score) for h in g.hits] for g in r.stores]  # noqa: E731
    assert pairs(indexed) == pairs(exact)  # not the halfvec rounding: the stored vectors'


def _plan(searches: list[sql.Nearest], path: str) -> str:
    sql_text, params = sql._statement([(n, s, path) for n, s in enumerate(searches)])
    with transaction.atomic(), connection.cursor() as cur:
        settings_sql, settings_params = sql._settings(100)
        cur.execute(settings_sql, settings_params)
        # A few dozen rows: the planner would rather sort them. Can the index serve the
        # statement as written (its ORDER BY reads the vector from the CTE)?
        cur.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
        cur.execute(f"EXPLAIN {sql_text}", params)
        return "\n".join(row[0] for row in cur.fetchall())


def test_the_index_path_walks_the_halfvec_index_and_the_exact_path_does_not(stores):
    vector = backend_for(stores["a"]).embedder().embed(["deploy"])[0]
    wide = backend_for(stores["c"]).embedder().embed(["deploy"])[0]
    searches = [
        sql.Nearest.of(stores["a"].pk, vector, 9, None, 384),
        sql.Nearest.of(stores["b"].pk, vector, 6, 0.85, 384),
        sql.Nearest.of(stores["c"].pk, wide, 12, None, 768),
    ]
    plan = _plan(searches, "index")
    assert plan.count("memoryitem_hnsw_half_384") == 2
    assert plan.count("memoryitem_hnsw_half_768") == 1
    shared = _plan(searches[:2], "shared")  # a and b: the same vector, one walk
    assert shared.count("memoryitem_hnsw_half_384") == 1
    assert "hnsw" not in _plan(searches, "exact")


def _searches(captured: CaptureQueriesContext) -> list[dict[str, Any]]:
    return [q for q in captured if "WITH q AS" in q["sql"]]


def test_small_stores_stay_exact_and_short_index_answers_are_redone_exactly(stores, flow, settings):
    # Under MEMORY_STORE_EXACT_MAX_ITEMS (2,000): the exact scan, whatever the index.
    # (The lookup of the index types, once per process, names the indexes: done first, as
    # the first search of a process does, so that the test holds whichever test ran before.)
    sql._index_type(384), sql._index_type(768)
    with CaptureQueriesContext(connection) as captured:
        node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[1])
    assert not any("hnsw" in q["sql"] or "halfvec" in q["sql"] for q in captured)
    # Index path: a threshold no item passes drops the index's rows afterwards.
    settings.MEMORY_STORE_EXACT_MAX_ITEMS = 10
    sql._sizes.clear()  # the size each store had is remembered for a minute
    vector = backend_for(stores["a"]).embedder().embed(["zzz qqq"])[0]
    search = sql.Nearest.of(stores["a"].pk, vector, 9, 0.0, 384)
    with CaptureQueriesContext(connection) as captured:
        assert sql.nearest_many([search]) == [[]]
    assert [("::halfvec(384)" in q["sql"]) for q in _searches(captured)] == [True]
    # An index answer shorter than asked (b holds 45 items) is redone exactly.
    search = sql.Nearest.of(stores["b"].pk, vector, 60, None, 384)
    with CaptureQueriesContext(connection) as captured:
        hits = sql.nearest_many([search])[0]
    assert [("::halfvec(384)" in q["sql"]) for q in _searches(captured)] == [True, False]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, embedding <=> %s::vector FROM memory_stores_memoryitem WHERE store_id = %s",
            [sql.vector_literal(vector), stores["b"].pk],
        )
        exact = sorted(cur.fetchall(), key=lambda r: (r[1], r[0]))
    assert [h.id for h in hits] == [str(r[0]) for r in exact]


def test_searches_wanting_different_ef_search_go_in_one_query_string(stores, settings):
    settings.MEMORY_STORE_EXACT_MAX_ITEMS = 10
    vector = backend_for(stores["a"]).embedder().embed(["museum invoice"])[0]
    small = sql.Nearest.of(stores["b"].pk, vector, 6, None, 384)
    large = sql.Nearest.of(stores["a"].pk, vector, 60, None, 384)  # ef_search 120
    with CaptureQueriesContext(connection) as captured:
        both = sql.nearest_many([small, large])
    assert len(_searches(captured)) == 1  # (and a size count per store)
    assert _searches(captured)[0]["sql"].count("set_config('hnsw.ef_search'") == 2
    assert both == [sql.nearest_many([small])[0], sql.nearest_many([large])[0]]
    assert [len(h) for h in both] == [6, 60]


def test_a_shared_walk_gives_each_store_what_its_own_walk_gives(stores, settings):
    settings.MEMORY_STORE_EXACT_MAX_ITEMS = 10
    embedder = backend_for(stores["a"]).embedder()
    for text in ("deploy the database", "museum invoice", "train", "quick plan note"):
        vector = embedder.embed([text])[0]
        for limits in ((9, 6), (3, 3), (45, 30)):
            searches = [
                sql.Nearest.of(stores[name].pk, vector, limit, None, 384)
                for name, limit in zip("ab", limits)
            ]
            with CaptureQueriesContext(connection) as captured:
                together = sql.nearest_many(searches)
            assert "ANY(" in _searches(captured)[0]["sql"]  # one walk for both
            alone = [sql._run([(s, "index")])[0] for s in searches]
            assert together == alone, (text, limits)
            assert [len(h) for h in together] == list(limits)


def test_a_server_binding_cursor_runs_one_statement_at_a_time(stores, flow, monkeypatch):
    batched = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[2])

    class NoClientCursor:
        pass

    monkeypatch.setattr(sql.psycopg, "ClientCursor", NoClientCursor)
    with CaptureQueriesContext(connection) as captured:
        single = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[2])
    assert not any(";" in q["sql"] for q in captured)
    ids = lambda r: [[h.id for h in g.hits] for g in r.stores]  # noqa: E731
    assert ids(single) == ids(batched)


def _lcs_table(a: list[str], b: list[str]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a, 1):
        for j, y in enumerate(b, 1):
            table[i][j] = (
                table[i - 1][j - 1] + 1 if x == y else max(table[i - 1][j], table[i][j - 1])
            )
    return table[-1][-1]


def test_bit_parallel_lcs_is_the_dynamic_programming_one():
    rng = random.Random(3)
    vocabulary = "a b c d e f g h".split()
    for _ in range(3000):
        a: list[Any] = [
            rng.choice(vocabulary[: rng.randint(1, 8)]) for _ in range(rng.randint(0, 70))
        ]
        b: list[Any] = [rng.choice(vocabulary) for _ in range(rng.randint(0, 70))]
        assert _lcs(a, b) == _lcs_table(a, b), (a, b)
    assert _lcs(["x"] * 200, ["x"] * 150) == 150  # wider than a machine word


# --- a file store's chunks, in the same round trip ------------------------------------
@pytest.fixture
def with_files(alice, flow, stores, tmp_path, settings) -> MemoryStore:
    """A file store over 40 one-chunk files, attached to node ``n`` after a, b and c."""
    root = (tmp_path / "files").resolve()
    rng = random.Random(3)
    for i in range(40):
        picked = rng.sample(TOPICS, 2) + rng.sample(FILLER, 4)
        (root / "docs").mkdir(parents=True, exist_ok=True)
        (root / "docs" / f"f{i:02d}.md").write_text(f"Note {i}: {' '.join(picked)}.")
    settings.MEMORY_STORE_FILE_ROOTS = [str(root)]
    memory_config_apply(
        owner=alice,
        document={
            "memory": [
                {"name": "docs", "type": "file", "config": {"file_sources": [{"path": "docs"}]}},
                {"name": "log", "type": "blackboard", "config": {}},
            ],
            "nodes": [
                {
                    "id": "n",
                    "flow": flow.name,
                    "memories": [
                        *NODE_N,
                        {"name": "docs", "top_k": 4, "write": False},
                        {"name": "log", "top_k": 2},
                    ],
                }
            ],
        },
    )
    log = MemoryStore.objects.get(name="log")
    MemoryItem.objects.bulk_create(
        MemoryItem(store=log, content_summary=f"entry {n}") for n in range(3)
    )
    assert knowledge_index_pending().finished  # into the chunks' HNSW index
    docs = MemoryStore.objects.select_related("knowledge_base").get(name="docs")
    assert docs.knowledge_base.chunk_count == 40
    return docs


def _chunk_reference(store: MemoryStore, query: str, top_k: int, threshold: float) -> list[str]:
    return [i for i, _ in _chunk_ranking(store, query, top_k, threshold)]


def _chunk_ranking(
    store: MemoryStore, query: str, top_k: int, threshold: float
) -> list[tuple[str, float]]:
    """Every chunk of the store's base by exact distance (then id), cut at the threshold:
    (hit id, similarity)."""
    vector = backend_for(store).embedder().embed([key_content(query, max_chars=500)])[0]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, embedding <=> %s::vector AS d FROM knowledge_chunk "
            "WHERE knowledge_base_id = %s ORDER BY d, id",
            [sql.vector_literal(vector), store.knowledge_base_id],
        )
        rows = cur.fetchall()
    kept = [(f"chunk:{i}", 1 - d) for i, d in rows if threshold <= -1 or 1 - d >= threshold - 1e-9]
    return kept[:top_k]


@pytest.mark.parametrize("path", ["exact", "index"])
def test_a_file_store_searches_its_chunks_in_the_same_query_string(
    with_files, flow, settings, path
):
    if path == "index":
        settings.MEMORY_STORE_EXACT_MAX_ITEMS = 10  # 40 chunks: the chunks' HNSW index
        sql._sizes.clear()
    for query in QUERIES[:3]:
        with CaptureQueriesContext(connection) as captured:
            result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=query)
        strings = [q["sql"] for q in captured.captured_queries if "knowledge_chunk" in q["sql"]]
        assert len(strings) == 1 and "UNION ALL" in strings[0]  # the items' searches too
        assert "ORDER BY id DESC" in strings[0]  # and the blackboard's newest: one trip
        # Besides: the node's attachments, and once a process, sizes and index names.
        others = [q["sql"] for q in captured if q["sql"] != strings[0]]
        assert sum("memoryattachment" in q for q in others) == 1
        once = ("SELECT count(*) FROM (SELECT 1", "SELECT to_regclass(")
        assert all("memoryattachment" in q or q.startswith(once) for q in others), others
        chunk_part = strings[0][strings[0].index("knowledge_chunk") - 200 :]
        assert ("::halfvec(384)" in chunk_part) is (path == "index")
        got = {g.store: [h.id for h in g.hits] for g in result.stores}
        reference = _chunk_ranking(with_files, query, 4, -1.0)
        if path == "exact":
            assert got["docs"] == [i for i, _ in reference], query
        else:  # the index ranks by halfvec: near-ties may swap, the distances may not
            similarities = [
                h.similarity for g in result.stores if g.store == "docs" for h in g.hits
            ]
            assert similarities == pytest.approx([s for _, s in reference], abs=2e-3), query
        hit = next(g for g in result.stores if g.store == "docs").hits[0]
        assert hit.metadata["file_path"].endswith(".md") and hit.metadata["chunk_index"] == 0
        assert hit.content.startswith("Note ")
        assert _alone(with_files, query, 4, -1.0) == got["docs"]  # the same on its own
        assert [h.content for h in result.stores[-1].hits] == ["entry 2", "entry 1"]


def test_a_file_store_index_answer_cut_short_or_pending_is_ranked_exactly(with_files, settings):
    settings.MEMORY_STORE_EXACT_MAX_ITEMS = 10
    kb = with_files.knowledge_base
    vector = backend_for(with_files).embedder().embed(["deploy the database"])[0]
    # More than the base holds: the index comes back short, the exact scan answers.
    wide = sql.ChunkNearest.of(kb.pk, vector, 50, None, 384, kb.chunk_count)
    with CaptureQueriesContext(connection) as captured:
        hits = sql.nearest_all([], [wide])[1][0]
    plans = [("::halfvec(384)" in q["sql"]) for q in captured if "knowledge_chunk" in q["sql"]]
    assert plans == [True, False]
    assert [f"chunk:{h.id}" for h in hits] == _chunk_reference(
        with_files, "deploy the database", 50, -1
    )
    # Rows the background indexer has not reached are ranked beside the index's.
    nearest = int(_chunk_reference(with_files, "deploy the database", 1, -1)[0].split(":")[1])
    Chunk.objects.filter(pk=nearest).update(index_pending=True)
    search = sql.ChunkNearest.of(kb.pk, vector, 3, None, 384, kb.chunk_count)
    assert sql.nearest_all([], [search])[1][0][0].id == nearest
    # A threshold: what the index found, cut (nothing is that close).
    strict = sql.ChunkNearest.of(kb.pk, vector, 3, 0.0, 384, kb.chunk_count)
    assert sql.nearest_all([], [strict])[1] == [[]]
