"""The searches of a node's stores, in one round trip: each store's answer is what the
retrieval engine's definition gives (tests/knowledge/reference.py) for its legs, the same
as the store searching alone; the exact path up to the items collection's ``exact_max``,
the halfvec HNSW index above it; BM25 over a store's items is exact; a file store
searches its knowledge base as a knowledge-base search does."""

from __future__ import annotations

import math
import random
import threading
from dataclasses import replace

import numpy as np
import pytest
from django.db import connection, transaction

from core import key_limits, tenancy
from knowledge import search as knowledge_search
from knowledge.models import Chunk
from knowledge.retrieval import db as retrieval_db
from knowledge.retrieval.engine import Scope
from knowledge.retrieval.vectors import vector_leg
from knowledge.search import SearchRequest, search_chunks
from knowledge.services import knowledge_index_pending
from memories.stores import search as store_search
from memories.stores.backends.base import QueryVectors, RetrieveQuery
from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.runtime import node_memory_retrieve
from memories.stores.selectors import node_attachments
from memories.stores.services import backend_for
from memories.stores.text import key_content, summary_hash
from tests.knowledge import reference

pytestmark = pytest.mark.django_db

TOPICS = ["deploy", "invoice", "mentor", "weather", "museum", "database", "schedule", "train"]
FILLER = "the a of team week new old first last big small quick plan note".split()
QUERIES = ["deploy the database", "invoice for the museum", "train schedule next week", "x"]
NODE_N = [  # node ``n``'s attachments of the three simple stores
    {"name": "a", "top_k": 3},
    {"name": "b", "top_k": 2, "similarity_threshold": 0.15},
    {"name": "c", "top_k": 4},
]
SETUP = {"a": (3, -1.0), "b": (2, 0.15), "c": (4, -1.0)}


def _fill(store: MemoryStore, n: int, rng: random.Random) -> None:
    embedder = backend_for(store).embedder()
    assert embedder is not None
    items = []
    for i in range(n):
        picked = rng.sample(TOPICS, 2) + rng.sample(FILLER, 4)
        summary = f"Input: question {i} Output: {' '.join(picked)} number {i}."
        vector = embedder.embed([summary])[0]
        items.append(
            MemoryItem(
                store=store,
                content_summary=summary,
                summary_hash=summary_hash(summary),
                embedding=vector,
                dimensions=len(vector),
            )
        )
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
            "nodes": [{"id": "n", "flow": flow.name, "memories": NODE_N}],
        },
    )
    found = {s.name: s for s in MemoryStore.objects.filter(owner=alice)}
    rng = random.Random(7)
    for name, n in (("a", 60), ("b", 45), ("c", 30)):
        _fill(found[name], n, rng)
    return found


def _item_lexemes(store: MemoryStore) -> list[tuple[int, str, int, int]]:
    """(item id, lexeme, tf, the item's length) for every lexeme of the store's items."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT i.id, u.lexeme, coalesce(array_length(u.positions, 1), 1), "
            "length(i.search_vector) - 1 FROM memory_stores_memoryitem i, "
            "unnest(i.search_vector) u WHERE i.store_id = %s AND u.lexeme NOT LIKE '~%%'",
            [store.pk],
        )
        return cur.fetchall()


def _bm25(store: MemoryStore, text: str) -> list[tuple[int, float]]:
    """BM25 of the store's items for ``text``, computed here from their lexemes (with
    positions) and the formula: k1 1.2, b 0.3, idf over the store's items."""
    rows = _item_lexemes(store)
    with connection.cursor() as cur:
        cur.execute("SELECT tsvector_to_array(to_tsvector('english', %s))", [text])
        query = set(cur.fetchone()[0])
    lengths = {i: dl for i, _, _, dl in rows}
    n, avgdl = len(lengths), sum(lengths.values()) / max(len(lengths), 1)
    df = {t: sum(1 for _, lex, _, _ in rows if lex == t) for t in query}
    scores: dict[int, float] = {}
    for i, lex, tf, dl in rows:
        if lex in query:
            idf = math.log(1 + (n - df[lex] + 0.5) / (df[lex] + 0.5))
            scores[i] = scores.get(i, 0.0) + idf * tf * 2.2 / (tf + 1.2 * (0.7 + 0.3 * dl / avgdl))
    return sorted(scores.items(), key=lambda r: (-r[1], r[0]))


def _reference(
    store: MemoryStore, query: str, top_k: int, threshold: float, pool: int = 50
) -> list[str]:
    """The simple store's answer computed the long way: every item's exact distance
    (pgvector's arithmetic) and BM25, the ``pool`` best of each, fused as the engine
    defines it (vector weight 1 - rerank_weight; a keyword candidate outside the vector
    pool counts its own similarity), the threshold keeping rows near enough only."""
    backend = backend_for(store)
    text = key_content(query, max_chars=backend.config["max_content_length"])
    vector = backend.embedder().embed([text])[0]
    rows, _ = retrieval_db.fetch(
        "SELECT id, embedding <=> %s::vector AS d FROM memory_stores_memoryitem "
        "WHERE store_id = %s AND embedding IS NOT NULL ORDER BY d, id",
        [retrieval_db.VectorParam(vector), store.pk],
    )
    cut = None if threshold <= -1 else 1.0 - threshold
    keyword = _bm25(store, text)[:pool]
    fused = reference.ranked(
        [(r[0], r[1]) for r in rows[:pool]], keyword, limit=10**6, fusion="max",
        weight=1.0 - backend.config["rerank_weight"], max_distance=cut,
        similarity={r[0]: 1.0 - r[1] for r in rows},
    )  # fmt: skip
    near = {r[0] for r in rows if cut is None or r[1] <= cut}
    return [str(i) for i, _ in fused if cut is None or i in near][:top_k]


def _alone(store: MemoryStore, query: str, top_k: int, threshold: float) -> list[str]:
    request = RetrieveQuery(query, top_k, threshold, "", QueryVectors(query))  # no batch
    return [h.id for h in backend_for(store).retrieve(request)]


def _round_trips(monkeypatch) -> list[int]:
    """How many statements each round trip of the retrieval engine sent."""
    trips: list[int] = []
    original = retrieval_db.fetch_all

    def counting(statements):
        trips.append(len(statements))
        return original(statements)

    monkeypatch.setattr(retrieval_db, "fetch_all", counting)
    monkeypatch.setattr(store_search, "fetch_all", counting)
    return trips


@pytest.mark.parametrize("path", ["exact", "index"])
def test_one_round_trip_gives_each_store_its_own_answer(stores, flow, monkeypatch, path):
    queries = QUERIES
    if path == "index":
        monkeypatch.setattr(store_search, "ITEMS", replace(store_search.ITEMS, exact_max=10))
        # "x" shares no word with any item: every distance ties, and which of the tied
        # items an approximate index finds first is its own business.
        queries = QUERIES[:3]
    for query in queries:
        trips = _round_trips(monkeypatch)
        result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=query)
        # the node's attachments (one prepared statement), then the three stores'
        # searches: one round trip
        assert trips == [1, 3]
        got = {g.store: [h.id for h in g.hits] for g in result.stores}
        for name, (top_k, threshold) in SETUP.items():
            expected = _reference(stores[name], query, top_k, threshold)
            assert got[name] == expected, (query, name)
            assert _alone(stores[name], query, top_k, threshold) == expected
        for group in result.stores:
            for hit in group.hits:
                assert hit.similarity is None or -1.0 <= hit.similarity <= 1.0
                assert hit.score is not None


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_stores_search_at_once(stores, flow, monkeypatch):
    """Outside a transaction each store's search is one statement on its own connection,
    the three at once (the caller's thread and the pool's): the same answers as in one
    round trip; inside one, one round trip still."""
    threads: list[str] = []
    original = retrieval_db.fetch_all

    def recording(statements):
        threads.append(threading.current_thread().name)
        assert len(statements) == 1
        return original(statements)

    monkeypatch.setattr(store_search, "fetch_all", recording)
    for query in QUERIES:
        threads.clear()
        result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=query)
        here = threading.current_thread().name
        assert sorted(n if n == here else "pool" for n in threads) == sorted([here, "pool", "pool"])
        assert all(n.startswith("search-leg") for n in threads if n != here)
        got = {g.store: [h.id for h in g.hits] for g in result.stores}
        for name, (top_k, threshold) in SETUP.items():
            assert got[name] == _reference(stores[name], query, top_k, threshold), (query, name)
    monkeypatch.setattr(store_search, "fetch_all", original)
    with transaction.atomic():
        trips = _round_trips(monkeypatch)
        node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[0])
        assert trips == [1, 3]  # the attachments, then the searches


@pytest.mark.django_db(transaction=True)
def test_large_stores_searched_with_one_vector_share_one_walk(stores, flow, monkeypatch):
    """Stores past the items' exact_max searched with the same query vector (a and b)
    are walked once, together: a store's first rows of that walk are its own walk's (the
    index hands its tuples in one order whatever the filter). Store a takes them; b, whose
    45 items are fewer than the 50 it wants, walks alone (and is redone exactly, as
    alone); c (768 dimensions: another vector) searches alone. Every answer is the exact
    reference's and the store's alone."""
    monkeypatch.setattr(store_search, "ITEMS", replace(store_search.ITEMS, exact_max=10))
    store_search._sizes.clear()
    sent: list[str] = []
    original = retrieval_db.fetch_all

    def recording(statements):
        sent.extend(s.sql for s in statements)
        return original(statements)

    monkeypatch.setattr(store_search, "fetch_all", recording)
    for query in QUERIES[:3]:
        sent.clear()
        result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=query)
        shared = [sql for sql in sent if sql.startswith("/* shared walk */")]
        searches = [sql for sql in sent if sql.startswith("/* items search */")]
        assert len(shared) == 1 and len(searches) == 3
        # a's rows come from the shared walk; b's and c's statements walk themselves
        assert sorted("/* vector leg" in sql for sql in searches) == [False, True, True]
        got = {g.store: [h.id for h in g.hits] for g in result.stores}
        for name, (top_k, threshold) in SETUP.items():
            expected = _reference(stores[name], query, top_k, threshold)
            assert got[name] == expected, (query, name)
            assert _alone(stores[name], query, top_k, threshold) == expected


@pytest.mark.django_db(transaction=True)
def test_the_stores_searches_on_the_pool_run_as_the_callers_owner(stores, flow, monkeypatch):
    """Row-level security: the pool's threads start as nobody (as when served); each
    search there carries the caller's owner (core.tenancy), or it would fail."""
    threads: list[str] = []
    original = retrieval_db.fetch_all

    def recording(statements):
        threads.append(threading.current_thread().name)
        return original(statements)

    monkeypatch.setattr(store_search, "fetch_all", recording)
    monkeypatch.setattr(tenancy, "_fallback", [tenancy.NOBODY])
    with tenancy.as_owner(flow.owner_id):
        result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[0])
        assert any(n.startswith("search-leg") for n in threads), threads
        got = {g.store: [h.id for h in g.hits] for g in result.stores}
        for name, (top_k, threshold) in SETUP.items():
            assert got[name] == _reference(stores[name], QUERIES[0], top_k, threshold), name


def test_keyword_matches_count_without_an_embedding(stores, flow):
    """An item without a vector (or a store without an embedder) is still found by its
    words; a query without words against a store without vectors gives the newest."""
    store = stores["a"]
    MemoryItem.objects.create(store=store, content_summary="Input: zebra Output: quagga")
    request = RetrieveQuery("zebra", 3, -1.0, "", QueryVectors("zebra"))
    hits = backend_for(store).retrieve(request)
    assert hits[0].content == "Input: zebra Output: quagga" and hits[0].similarity is None


def test_bm25_over_a_stores_items_is_exact(stores):
    store = stores["a"]
    for text in ("deploy the database", "museum invoice number", "train train quick"):
        leg = store_search.counted_leg(
            table=store_search.TABLE, token=f"~store:{store.pk}", text=text, pool=100,
            totals=(store_search._TOTALS, [str(store.pk)]),
        )  # fmt: skip
        got = [(row[0], float(row[1])) for row in leg.run()]
        want = _bm25(store, text)
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-9)


def test_the_stores_counters_follow_its_items(stores):
    store = stores["b"]

    def counters():
        with connection.cursor() as cur:
            cur.execute(
                "SELECT item_count, text_lexemes FROM memory_stores_memorystore WHERE id = %s",
                [store.pk],
            )
            row = cur.fetchone()
            cur.execute(
                "SELECT count(*), coalesce(sum(length(search_vector) - 1), 0) "
                "FROM memory_stores_memoryitem WHERE store_id = %s",
                [store.pk],
            )
            return row, cur.fetchone()

    kept, counted = counters()
    assert kept == counted and kept[0] == 45
    MemoryItem.objects.filter(store=store, id__in=list(
        MemoryItem.objects.filter(store=store).values_list("id", flat=True)[:5]
    )).delete()  # fmt: skip
    MemoryItem.objects.filter(store=store).update(content_summary="one two three")
    kept, counted = counters()
    assert kept == counted == (40, 40 * 3)


def test_distances_are_the_exact_ones_on_the_index_path(stores, flow, monkeypatch):
    exact = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[0])
    monkeypatch.setattr(store_search, "ITEMS", replace(store_search.ITEMS, exact_max=10))
    indexed = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=QUERIES[0])
    pairs = lambda r: [[(h.id, h.similarity, h.score) for h in g.hits] for g in r.stores]  # noqa: E731
    assert pairs(indexed) == pairs(exact)  # not the halfvec rounding: the stored vectors'


def _leg(store: MemoryStore, text: str, limit: int, exact_max: int):
    vector = backend_for(store).embedder().embed([text])[0]
    items = replace(store_search.ITEMS, exact_max=exact_max)
    size = ("SELECT item_count FROM memory_stores_memorystore WHERE id = %s", [str(store.pk)])
    scope = Scope("store_id = %s AND embedding IS NOT NULL", [str(store.pk)], size=size)
    return vector_leg(items, scope, store.embedding_dimensions, vector, limit), vector


def test_the_index_path_walks_the_halfvec_index_and_the_exact_path_does_not(stores):
    for name, index in (("a", "memoryitem_hnsw_half_384"), ("c", "memoryitem_hnsw_half_768")):
        leg, _ = _leg(stores[name], "deploy", 9, exact_max=10)
        with connection.cursor() as cur:  # (a few dozen rows: the planner would sort)
            cur.execute("SET LOCAL enable_seqscan = off")
        plan, _ = retrieval_db.fetch("EXPLAIN " + leg.sql, leg.params, prepare=False)
        assert index in "\n".join(row[0] for row in plan)
        assert all(row[2] for row in leg.run())  # every row from the walk
        # Up to exact_max items (the store's counter, read in the statement): the walk is
        # gated off, the exact scan answers.
        small, _ = _leg(stores[name], "deploy", 9, exact_max=2000)
        assert small.path == "filtered" and not any(row[2] for row in small.run())


def test_short_index_answers_are_redone_exactly(stores):
    # An index answer shorter than asked (b holds 45 items) is redone exactly.
    leg, vector = _leg(stores["b"], "zzz qqq", 60, exact_max=10)
    rows = leg.run()
    assert not any(row[2] for row in rows)  # the exact scan's rows
    exact, _ = retrieval_db.fetch(
        "SELECT id, embedding <=> %s::vector AS d FROM memory_stores_memoryitem "
        "WHERE store_id = %s ORDER BY d, id",
        [retrieval_db.VectorParam(vector), stores["b"].pk],
    )
    assert [r[0] for r in rows] == [r[0] for r in exact]
    assert [r[1] for r in rows] == [r[1] for r in exact]


def test_searches_wanting_different_walks_go_in_one_round_trip(stores, monkeypatch):
    monkeypatch.setattr(store_search, "ITEMS", replace(store_search.ITEMS, exact_max=10))
    vector = backend_for(stores["a"]).embedder().embed(["museum invoice"])[0]
    small = store_search.ItemSearch.of(stores["b"], "museum invoice", vector, 6, None, 0.3)
    large = store_search.ItemSearch.of(stores["a"], "museum invoice", vector, 60, None, 0.3)
    trips = _round_trips(monkeypatch)
    together = store_search.run([small, large])
    assert trips == [2]
    settings = [dict(s.local) for s in (small.statement(), large.statement())]
    assert [s["hnsw.ef_search"] for s in settings] == [100, 360]
    assert together == [store_search.run([small])[0], store_search.run([large])[0]]
    assert [len(h) for h in together] == [6, 60]


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


def _chunk_search(store: MemoryStore, query: str, top_k: int, threshold: float | None):
    """A knowledge-base search of the file store's base with the store's query."""
    text = key_content(query, max_chars=500)
    vector = backend_for(store).embedder().embed([text])[0]
    request = SearchRequest(
        query=text, vector=np.asarray(vector, dtype=np.float64).tolist(), top_k=top_k,
        similarity_threshold=threshold,
    )  # fmt: skip
    return search_chunks(bases=[store.knowledge_base], request=request)


def test_a_file_store_searches_its_chunks_in_the_same_round_trip(with_files, flow, monkeypatch):
    for query in QUERIES[:3]:
        trips = _round_trips(monkeypatch)
        result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=query)
        # the attachments; then three item stores, the file store, the blackboard's newest
        assert trips == [1, 5]
        hits = next(g for g in result.stores if g.store == "docs").hits
        want = _chunk_search(with_files, query, 4, None)
        assert [h.id for h in hits] == [f"chunk:{h.chunk_id}" for h in want], query
        assert [h.score for h in hits] == [h.score for h in want]
        assert [h.similarity for h in hits] == [h.vector_score for h in want]
        assert hits[0].metadata["file_path"].endswith(".md")
        assert hits[0].metadata["chunk_index"] == 0 and hits[0].content.startswith("Note ")
        assert _alone(with_files, query, 4, -1.0) == [h.id for h in hits]  # the same alone
        assert [h.content for h in result.stores[-1].hits] == ["entry 2", "entry 1"]


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_a_file_store_searches_as_its_base_does(
    with_files, stores, flow, monkeypatch
):
    """Outside a transaction the file store's search is its base's own search (its legs
    at once on two connections from SPLIT_MIN_ROWS chunks), beside the others: the
    same hits and scores as in one round trip."""
    monkeypatch.setattr(knowledge_search, "SPLIT_MIN_ROWS", 1)
    legs = []
    original = knowledge_search.rank
    monkeypatch.setattr(knowledge_search, "rank", lambda *a: legs.append(a[-1]) or original(*a))
    for query in QUERIES[:3]:
        legs.clear()
        result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=query)
        assert legs == [True]  # (split)
        got = {g.store: g.hits for g in result.stores}
        want = _chunk_search(with_files, query, 4, None)
        assert [h.id for h in got["docs"]] == [f"chunk:{h.chunk_id}" for h in want], query
        assert [h.score for h in got["docs"]] == [h.score for h in want]
        with transaction.atomic():  # (one round trip)
            inside = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query=query)
        assert [(g.store, [(h.id, h.score) for h in g.hits]) for g in inside.stores] == [
            (g.store, [(h.id, h.score) for h in g.hits]) for g in result.stores
        ]
        for name, (top_k, threshold) in SETUP.items():
            assert [h.id for h in got[name]] == _reference(stores[name], query, top_k, threshold)
        assert [h.content for h in got["log"]] == ["entry 2", "entry 1"]


def test_a_file_stores_threshold_and_pending_chunks(with_files, monkeypatch):
    """Rows the background indexer has not reached are found beside the index's; a
    threshold keeps only chunks near enough by meaning in the vector leg."""
    monkeypatch.setattr(
        knowledge_search,
        "CHUNKS",
        replace(knowledge_search.CHUNKS, exact_max=0, walk_min_share=0.0),
    )
    kb = with_files.knowledge_base
    want = _chunk_search(with_files, "deploy the database", 3, None)
    Chunk.objects.filter(knowledge_base=kb, pk=want[0].chunk_id).update(index_pending=True)
    request = RetrieveQuery("deploy the database", 3, -1.0, "", QueryVectors("q"))
    got = backend_for(with_files).retrieve(request)
    assert [h.id for h in got] == [f"chunk:{h.chunk_id}" for h in want]
    strict = RetrieveQuery("deploy the database", 3, 0.999, "", QueryVectors("q"))
    assert all(h.similarity is None for h in backend_for(with_files).retrieve(strict))


@pytest.mark.parametrize("walked", [False, True])
def test_past_its_sample_the_keyword_leg_scores_the_newest_matches(stores, monkeypatch, walked):
    """A query most of a scope matches: only the ``COUNTED_SAMPLE`` newest matching rows
    are read and scored (here by id, the call giving no time; walked, by creation time
    through the store's index, the same rows), a word's document frequency estimated from
    them (x matches / sample, the matches counted, or estimated from the walk's share);
    N and the lengths stay the scope's."""
    from knowledge.retrieval import bm25

    monkeypatch.setattr(bm25, "COUNTED_SAMPLE", 20)
    store, text = stores["a"], "number question"  # every item holds both words
    how = {"newest": "created_at", "walk": ("store_id = %s", [str(store.pk)])} if walked else {}
    leg = store_search.counted_leg(
        table=store_search.TABLE, token=f"~store:{store.pk}", text=text, pool=100,
        totals=(store_search._TOTALS, [str(store.pk)]), **how,
    )  # fmt: skip
    got = [(row[0], float(row[1])) for row in leg.run()]
    rows = _item_lexemes(store)
    lengths = {i: dl for i, _, _, dl in rows}
    n, avgdl = len(lengths), sum(lengths.values()) / len(lengths)
    assert n == 60
    sample = set(sorted(lengths, reverse=True)[:20])  # every item matches: the newest ids
    query = {"number", "question"}
    df = {t: sum(1 for i, lex, _, _ in rows if lex == t and i in sample) * 60 / 20 for t in query}
    scores: dict[int, float] = {}
    for i, lex, tf, dl in rows:
        if lex in query and i in sample:
            idf = math.log(1 + (n - df[lex] + 0.5) / (df[lex] + 0.5))
            scores[i] = scores.get(i, 0.0) + idf * tf * 2.2 / (tf + 1.2 * (0.7 + 0.3 * dl / avgdl))
    # Ties: the newer first (walked: by time, which follows the ids here), else by id.
    want = sorted(scores.items(), key=lambda r: (-r[1], -r[0] if walked else r[0]))
    assert len(got) == 20 and {i for i, _ in got} == sample
    assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-9)
    assert [i for i, _ in got] == [i for i, _ in want]


def test_a_walked_sample_estimates_the_matches_from_its_share(stores, monkeypatch):
    """Walked, the matches are not counted past the sample: the newest ``COUNTED_SAMPLE``
    matches came from the newest W items, so the store's 60 items hold about
    sample x 60 / W matches; each word's frequency in the sample is scaled by that over
    the sample. A text fewer items match than the sample is counted exactly (the same
    figures as without a walk)."""
    from knowledge.retrieval import bm25

    monkeypatch.setattr(bm25, "COUNTED_SAMPLE", 5)
    store, text = stores["a"], "deploy museum"  # a quarter of the items hold each word
    rows = _item_lexemes(store)
    lengths = {i: dl for i, _, _, dl in rows}
    n, avgdl = len(lengths), sum(lengths.values()) / len(lengths)
    query = {"deploy", "museum"}
    matching = sorted({i for i, lex, _, _ in rows if lex in query}, reverse=True)
    assert len(matching) > 5
    sample = set(matching[:5])
    walked_rows = sum(1 for i in lengths if i >= min(sample))
    scale = round(5 * n / walked_rows) / 5
    df = {t: sum(1 for i, lex, _, _ in rows if lex == t and i in sample) * scale for t in query}
    scores: dict[int, float] = {}
    for i, lex, tf, dl in rows:
        if lex in query and i in sample:
            idf = math.log(1 + (n - df[lex] + 0.5) / (df[lex] + 0.5))
            scores[i] = scores.get(i, 0.0) + idf * tf * 2.2 / (tf + 1.2 * (0.7 + 0.3 * dl / avgdl))
    want = sorted(scores.items(), key=lambda r: (-r[1], -r[0]))  # ties: the newer first

    def leg(walk: bool, sample: int) -> list[tuple[int, float]]:
        monkeypatch.setattr(bm25, "COUNTED_SAMPLE", sample)
        how = {"walk": ("store_id = %s", [str(store.pk)])} if walk else {}
        found = store_search.counted_leg(
            table=store_search.TABLE, token=f"~store:{store.pk}", text=text, pool=100,
            totals=(store_search._TOTALS, [str(store.pk)]), newest="created_at", **how,
        )  # fmt: skip
        return [(row[0], float(row[1])) for row in found.run()]

    got = leg(True, 5)
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-9)
    assert leg(True, 500) == leg(False, 500)  # under the sample: every match, counted


def _sampled_bm25(store: MemoryStore, text: str, sample: int) -> list[tuple[int, float]]:
    """The store's keyword leg computed here: every item holding a query word when at most
    ``sample`` do, else the ``sample`` newest of them, each word's document frequency
    counted among them and scaled by round(sample x N / the items from the newest down
    to the oldest sampled) over the sample; each item's terms added in lexeme order;
    ties: the newer first (creation time follows the ids here)."""
    rows = _item_lexemes(store)
    with connection.cursor() as cur:
        cur.execute("SELECT tsvector_to_array(to_tsvector('english', %s))", [text])
        query = set(cur.fetchone()[0])
    lengths = {i: dl for i, _, _, dl in rows}
    n, avgdl = len(lengths), sum(lengths.values()) / len(lengths)
    matching = sorted({i for i, lex, _, _ in rows if lex in query}, reverse=True)
    chosen, scale = set(matching), 1.0
    if len(matching) > sample:
        chosen = set(matching[:sample])
        scale = round(sample * n / sum(1 for i in lengths if i >= min(chosen))) / sample
    df = {t: sum(1 for i, lex, _, _ in rows if lex == t and i in chosen) * scale for t in query}
    terms = sorted((i, lex, tf, dl) for i, lex, tf, dl in rows if lex in query and i in chosen)
    scores: dict[int, float] = {}
    for i, lex, tf, dl in terms:  # (a tsvector's lexemes are in byte order, as here)
        idf = math.log(1 + (n - df[lex] + 0.5) / (df[lex] + 0.5))
        scores[i] = scores.get(i, 0.0) + idf * tf * 2.2 / (tf + 1.2 * (0.7 + 0.3 * dl / avgdl))
    return sorted(scores.items(), key=lambda r: (-r[1], -r[0]))


def _walked_leg(store: MemoryStore, text: str) -> tuple[str, list[tuple[int, float]]]:
    """How the store's keyword leg found its sample (``kd``: walked, all, counted) and its
    rows, (id, score) best first."""
    leg = store_search.counted_leg(
        table=store_search.TABLE, token=f"~store:{store.pk}", text=text, pool=100,
        totals=(store_search._TOTALS, [str(store.pk)]), newest="created_at",
        walk=("store_id = %s", [str(store.pk)]),
    )  # fmt: skip
    head = leg.sql[: leg.sql.index("\nkr AS MATERIALIZED")].rstrip(",")
    (how,), _ = retrieval_db.fetch(
        head + "\nSELECT how FROM kd", leg.params[: head.count("%s")], prepare=False
    )
    return how[0], [(row[0], float(row[1])) for row in leg.run()]


@pytest.mark.parametrize(
    ("text", "sample", "probe", "how"),
    [
        ("number question", 20, 100, "walked"),  # every item: the walk finds 21 in 21
        ("55 56 57 58 59", 30, 5, "all"),  # the 5 newest items only: the walk reads all 60
        ("deploy", 20, 100, "counted"),  # a quarter: not walked first; every match
        ("0 1 2 3 4 5 6 7 8 9 10 11", 10, 100, "counted"),  # the 12 oldest: counted, walked
        # Nearly half the items: the walk first, which finds 5 or fewer in the newest 10
        # (2 x the sample): counted, walked.
        ("museum deploy", 5, 100, "counted"),
    ],
)
def test_every_way_to_the_sample_ranks_the_same(stores, monkeypatch, text, sample, probe, how):
    """The keyword leg of a store scores the same rows the same way whichever way its
    statement finds them (the walk first when the newest items promise more matches than
    twice the sample, else the GIN count first): the ids and scores computed here, in
    the same order, and the same figures as with the walk never first."""
    from knowledge.retrieval import bm25

    store = stores["a"]
    monkeypatch.setattr(bm25, "COUNTED_SAMPLE", sample)
    monkeypatch.setattr(bm25, "COUNTED_PROBE", probe)
    found, got = _walked_leg(store, text)
    want = _sampled_bm25(store, text, sample)
    assert found == how
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-12)
    monkeypatch.setattr(bm25, "COUNTED_PROBE", 0)  # (nothing probed: never walked first)
    assert _walked_leg(store, text) == ("counted", got)


def test_an_items_text_vector_stays_in_its_row(stores):
    """The keyword leg reads every scored item's text vector: it stays in the item's row
    (memory_stores 0008, ``STORAGE MAIN``) beside the 32-bit vector, where PostgreSQL
    used to move it out of line (TOAST: one lookup per item scored) as the largest column
    of a row past 2 kB; the snapshots and the summary, read for hits only, go first."""
    rng = random.Random(3)
    words = (TOPICS + FILLER) * 3
    store = stores["a"]
    embedder = backend_for(store).embedder()
    assert embedder is not None
    items = []
    for i in range(20):
        asked = " ".join(rng.choice(words) for _ in range(12))
        answer = " ".join(rng.choice(words) for _ in range(30))
        summary = f"Input: {asked} Output: {answer} #{i}"
        vector = embedder.embed([summary])[0]
        items.append(MemoryItem(
            store=store, content_summary=summary, summary_hash=summary_hash(summary),
            input_snapshot={"text": summary[:80], "blocks": []},
            output_snapshot={"text": summary, "blocks": []},
            embedding=vector, dimensions=len(vector),
        ))  # fmt: skip
    made = MemoryItem.objects.bulk_create(items)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), count(pg_column_toast_chunk_id(search_vector)),"
            " count(pg_column_toast_chunk_id(output_snapshot)), min(pg_column_size(i.*))"
            " FROM memory_stores_memoryitem i WHERE id = ANY(%s)",
            [[m.pk for m in made]],
        )
        rows, text_out, snapshot_out, smallest = cur.fetchone()
    assert (rows, text_out, snapshot_out) == (20, 0, 20)
    assert smallest < 2032 < smallest + 1544  # (past 2 kB with its vector: toasted)


def test_a_keyword_candidate_outside_the_vector_pool_counts_its_own_similarity(stores, monkeypatch):
    """``max`` fusion: an item the keyword leg found and the vector leg did not hand over
    is scored with its own cosine similarity, read by its key, not with 0. Three items
    nearer the query than K (cosines 0.90, 0.89, 0.88) fill a vector pool of three; K
    (cosine 0.80) alone holds the query's word. K: 0.7 x 0.80 + 0.3 x 1 = 0.86 beats the
    nearest's 0.7 x 0.90 = 0.63; counted with 0 (``complete`` off) it would score 0.3."""
    store = stores["a"]
    axis = np.eye(384)
    near = [(f"plain note {i}", c * axis[0] + math.sqrt(1 - c * c) * axis[i + 1])
            for i, c in enumerate((0.90, 0.89, 0.88))]  # fmt: skip
    made = MemoryItem.objects.bulk_create(
        MemoryItem(
            store=store,
            content_summary=text,
            summary_hash=summary_hash(text),
            embedding=vector.tolist(),
            dimensions=384,
        )  # fmt: skip
        for text, vector in [*near, ("zebra crossing", 0.8 * axis[0] + 0.6 * axis[50])]
    )
    monkeypatch.setattr(store_search, "CANDIDATES", 1)  # (pools of 3 x top_k)
    search = store_search.ItemSearch.of(store, "zebra", axis[0], 1, None, 0.3)
    [hit] = store_search.run([search])[0]
    assert hit.id == str(made[3].pk) and hit.content == "zebra crossing"
    assert hit.similarity == pytest.approx(0.8, abs=1e-6)
    assert hit.score == pytest.approx(0.7 * 0.8 + 0.3, abs=1e-6)
    monkeypatch.setattr(store_search, "ITEMS", replace(store_search.ITEMS, complete=False))
    [hit] = store_search.run([search])[0]
    assert hit.id == str(made[0].pk) and hit.score == pytest.approx(0.7 * 0.9, abs=1e-6)


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_a_nodes_attachments_are_the_orms_with_their_stores_and_bases(
    with_files, flow, django_assert_num_queries, monkeypatch
):
    """``node_attachments`` (one prepared statement) gives the attachments the ORM's query
    gives, in order, each with its store and a file store's knowledge base already there;
    a key narrowed to named stores gets those of its stores."""
    orm = list(
        MemoryAttachment.objects.filter(flow_id=flow.pk, node_id="n")
        .select_related("store", "store__knowledge_base")
        .order_by("position", "id")
    )
    with django_assert_num_queries(1):
        got = node_attachments(flow_id=flow.pk, node_id="n")
        assert [_fields(a) for a in got] == [_fields(a) for a in orm]
        assert [_fields(a.store) for a in got] == [_fields(a.store) for a in orm]
        bases = [a.store.knowledge_base for a in got]
    assert [b and _fields(b) for b in bases] == [
        a.store.knowledge_base and _fields(a.store.knowledge_base) for a in orm
    ]
    assert [a.store.name for a in got] == ["a", "b", "c", "docs", "log"]
    assert isinstance(got[0].retrieve_stage, list) and isinstance(got[0].store.config, dict)
    assert bases[3] == with_files.knowledge_base and bases[4] is None
    kept = [str(got[1].store_id), str(got[3].store_id)]
    limits = key_limits.KeyLimits(memory_stores=frozenset(kept))
    monkeypatch.setattr(key_limits, "current", lambda: limits)
    narrowed = node_attachments(flow_id=flow.pk, node_id="n")
    assert [a.store.name for a in narrowed] == ["b", "docs"]
    assert node_attachments(flow_id=flow.pk, node_id="nobody") == []
