"""Search of memory stores: store items as a collection of the retrieval engine
(``knowledge.retrieval``), and the searches of one retrieve call run at once.

A ``simple`` store ranks its items by meaning and by keyword (BM25 over the store's
items), fused as facts are: the vector weight x the cosine similarity + the rest x the
BM25 score over the best keyword candidate's; the store's ``rerank_weight`` is the
keyword share. A ``file`` store searches its knowledge base as a knowledge-base search
does (``knowledge.search``); a ``blackboard`` reads its newest entries.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.db import connection

from knowledge.models import KnowledgeBase
from knowledge.retrieval import hnsw
from knowledge.retrieval.bm25 import counted_leg
from knowledge.retrieval.db import Statement, at_once, fetch, fetch_all
from knowledge.retrieval.engine import (
    CANDIDATES,
    Collection,
    Leg,
    Ranking,
    Scope,
    rows_of,
    statement,
)
from knowledge.retrieval.vectors import shared_walk, vector_leg
from knowledge.search import Hit, SearchRequest, chunk_statement, hit_of, search_chunks
from memories.stores.backends.base import StoreHit

TABLE = "memory_stores_memoryitem"
ITEMS = Collection(
    name="items",
    table=TABLE,
    index_prefix="memoryitem_hnsw",
    id_type="bigint",
    details="t.id, t.content_summary, t.metadata, t.created_at",
    time="created_at",
    tiebreak="{top}.id",
    fusion="max",
    vector_weight=0.7,
    # Stores up to this many items are scanned exactly, larger ones walk the HNSW index
    # of their dimension (filtered to the store).
    exact_max=2000,
)
_EMBEDDED = "embedding IS NOT NULL"  # (the items a vector leg ranks, of a store's)
# The store's size (``item_count``) and text statistics, kept on its row by triggers
# (migration 0004).
_TOTALS = "SELECT item_count, text_lexemes FROM memory_stores_memorystore WHERE id = %s"


def _store_hit(row: dict[str, Any]) -> StoreHit:
    metadata = row["metadata"]
    if isinstance(metadata, str):  # Django's connection hands jsonb over as text
        metadata = json.loads(metadata)
    similarity = None if row.get("vscore") is None else float(row["vscore"])
    return StoreHit(
        id=str(row["id"]),
        content=row["content_summary"],
        score=float(row["score"]) if "score" in row else similarity,
        similarity=similarity,
        metadata=metadata or {},
        created_at=row["created_at"],
    )


@dataclass(frozen=True)
class ItemSearch:
    """A ``simple`` store's search: its ``top_k`` items best matching ``text`` (and
    ``vector``, float64 bytes, when the store embeds), those of the vector leg only
    within ``max_distance`` when a threshold is set; ``keyword_share`` of the score is
    the keyword leg's."""

    store_id: str
    text: str
    vector: bytes | None
    dims: int | None
    top_k: int
    max_distance: float | None
    keyword_share: float

    @classmethod
    def of(
        cls, store: Any, text: str, vector: Any, top_k: int, max_distance: float | None,
        keyword_share: float,
    ) -> ItemSearch:  # fmt: skip
        data = None if vector is None else np.asarray(vector, dtype=np.float64).tobytes()
        dims = store.embedding_dimensions
        return cls(str(store.pk), text, data, dims, top_k, max_distance, keyword_share)

    @property
    def pool(self) -> int:
        return max(self.top_k * 3, CANDIDATES)

    def legs(self) -> tuple[Leg | None, Leg | None, Ranking]:
        pool = self.pool
        vector = None
        if self.vector is not None and self.dims:
            size = (
                "SELECT item_count FROM memory_stores_memorystore WHERE id = %s",
                [self.store_id],
            )
            scope = Scope(f"store_id = %s AND {_EMBEDDED}", [self.store_id], size=size)
            values = np.frombuffer(self.vector, dtype=np.float64)
            vector = vector_leg(ITEMS, scope, self.dims, values, pool)
        keyword = counted_leg(
            table=TABLE, token=f"~store:{self.store_id}", text=self.text, pool=pool,
            totals=(_TOTALS, [self.store_id]), newest="created_at",
            walk=("store_id = %s", [self.store_id]),  # (memoryitem_store_created)
        )  # fmt: skip
        ranking = Ranking(
            limit=self.top_k,
            max_distance=self.max_distance,
            vector_weight=1.0 - self.keyword_share,
            vector_required=self.max_distance is not None and vector is not None,
        )
        return vector, keyword, ranking

    def statement(self) -> Statement:
        vector, keyword, ranking = self.legs()
        if vector is None and keyword is None:
            return Newest(self.store_id, self.top_k).statement()
        return statement(ITEMS, vector, keyword, ranking)

    def hits(self, rows: list[dict[str, Any]]) -> list[StoreHit]:
        return [_store_hit(row) for row in rows]


@dataclass(frozen=True)
class ChunkSearch:
    """A ``file`` store's search of its knowledge base (a knowledge-base search)."""

    knowledge_base: KnowledgeBase
    text: str
    vector: bytes
    top_k: int
    threshold: float | None

    def _request(self) -> SearchRequest:
        # (a file store's chunks are documents, which no cue of the query lifts: without
        # cues, and with the vector given, the search sends no statement of its own)
        return SearchRequest(
            query=self.text, vector=np.frombuffer(self.vector, dtype=np.float64).tolist(),
            top_k=self.top_k, similarity_threshold=self.threshold, query_cues=False,
        )  # fmt: skip

    def statement(self) -> Statement:
        return chunk_statement(bases=[self.knowledge_base], request=self._request())

    def hits(self, rows: list[dict[str, Any]]) -> list[Hit]:
        return [hit_of(row) for row in rows]

    def found(self) -> list[Hit]:
        """The hits as a knowledge-base search finds them on its own: a large base's
        legs at once, each on its own connection, then fused (the same ranking)."""
        return search_chunks(bases=[self.knowledge_base], request=self._request())


@dataclass(frozen=True)
class Newest:
    """A store's newest ``limit`` items, created at ``since`` or later (None: any)."""

    store_id: str
    limit: int
    since: datetime | None = None

    def statement(self) -> Statement:
        age = " AND created_at >= %s" if self.since is not None else ""
        params: list[Any] = [self.store_id] + ([self.since] if self.since is not None else [])
        sql = (
            f"SELECT id, content_summary, metadata, created_at FROM {TABLE} "
            f"WHERE store_id = %s{age} ORDER BY id DESC LIMIT {int(self.limit)}"
        )
        return Statement(sql, params)

    def hits(self, rows: list[dict[str, Any]]) -> list[StoreHit]:
        return [_store_hit(row) for row in rows]


Search = ItemSearch | ChunkSearch | Newest


def run(searches: list[Search]) -> list[list[Any]]:
    """Each search's hits, best first: the searches at once, each on its own connection
    (``at_once``: a retrieve call takes its longest search's time, not their sum: each
    is a statement the server runs on one core), a file store's on this thread (its
    base's legs may go on two more); large stores searched with the same query vector
    share one walk of the index (``_run_at_once``); inside a transaction, all in one
    round trip."""
    if not searches:
        return []
    if connection.in_atomic_block:
        results = fetch_all([s.statement() for s in searches])
        return [s.hits(rows_of(result)) for s, result in zip(searches, results)]
    return _run_at_once(searches, _sharing(searches))


# Stores' sizes (items) as last read here, and when (``hnsw.kept_counts``): whether two
# stores may share a walk. A size that has changed since costs time, never rows: the
# shared walk reads the sizes itself and walks only the stores past ITEMS.exact_max, as
# their own searches would.
_sizes: dict[str, tuple[float, float]] = {}


def _store_sizes(store_ids: list[str]) -> dict[str, float]:
    rows, _ = fetch(
        "SELECT id::text, item_count FROM memory_stores_memorystore WHERE id = ANY(%s::uuid[])",
        [store_ids],
    )
    return {store_id: float(n) for store_id, n in rows}


def _large(store_ids: list[str]) -> set[str]:
    sizes = hnsw.kept_counts(_sizes, store_ids, _store_sizes)
    return {i for i in store_ids if sizes[i] > ITEMS.exact_max}


def _sharing(searches: list[Search]) -> list[list[ItemSearch]]:
    """Groups of two or more large stores' searches with the same query vector (and
    pool): each group's stores are walked once, together."""
    groups: dict[tuple[Any, ...], list[ItemSearch]] = defaultdict(list)
    for s in searches:
        if isinstance(s, ItemSearch) and s.vector is not None and s.dims:
            if hnsw.index_type(ITEMS.index_prefix, s.dims) is not None:
                groups[(s.dims, s.vector, s.pool)].append(s)
    pairs = [g for g in groups.values() if len({s.store_id for s in g}) > 1]
    if not pairs:
        return []
    large = _large(sorted({s.store_id for g in pairs for s in g}))
    pairs = [[s for s in g if s.store_id in large] for g in pairs]
    return [g for g in pairs if len({s.store_id for s in g}) > 1]


# The stores of a shared walk: those past the items' exact_max, as each store's own
# search decides (its vector leg's ``sm``).
_WALKED = (
    "SELECT coalesce(array_agg(id), '{}') AS keys FROM memory_stores_memorystore"
    " WHERE id = ANY(%s::uuid[]) AND item_count > %s"
)


def _shared_walk(group: list[ItemSearch]) -> Statement:
    first = group[0]
    vector = np.frombuffer(first.vector or b"", dtype=np.float64)
    walked = (_WALKED, [[s.store_id for s in group], ITEMS.exact_max])
    return shared_walk(ITEMS, first.dims or 0, vector, first.pool, "store_id", walked, _EMBEDDED)


def _run_at_once(searches: list[Search], groups: list[list[ItemSearch]]) -> list[list[Any]]:
    """``run`` outside a transaction: at once, each group's shared walk, the grouped
    stores' keyword legs and every other search (a file store's first: on this thread);
    then, in one round trip, each grouped store's search with its legs' rows given: a
    store's first ``pool`` rows of the walk are its own walk's (``vectors.shared_walk``),
    and a store left with fewer walks alone there. The same rows and scores as each
    store searching alone."""
    grouped = [s for g in groups for s in g]
    legs = {s: s.legs() for s in grouped}
    walks = [_shared_walk(g) for g in groups]
    others = sorted(
        (i for i, s in enumerate(searches) if s not in legs),
        key=lambda i: not isinstance(searches[i], ChunkSearch),
    )
    keyword = [leg for s in grouped if (leg := legs[s][1]) is not None]
    calls: list[Callable[[], Any]] = [_found(searches[i]) for i in others]
    calls += [functools.partial(_rows, w) for w in walks]
    calls += [leg.run for leg in keyword]
    done = at_once(calls)
    out: list[list[Any]] = [[] for _ in searches]
    for i, hits in zip(others, done):
        out[i] = hits
    for g, rows in zip(groups, done[len(others) :]):
        walked: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        for row in rows:  # (in the index's order)
            walked[str(row[4])].append(tuple(row[:4]))
        for s in g:
            vector = legs[s][0]
            found = walked.get(s.store_id, [])
            if vector is not None and len(found) >= s.pool:
                vector.rows = sorted(found[: s.pool], key=lambda r: (r[1], r[0]))
    if not grouped:
        return out
    results = fetch_all([statement(ITEMS, *legs[s]) for s in grouped])
    hits = {s: s.hits(rows_of(result)) for s, result in zip(grouped, results)}
    for i, search in enumerate(searches):
        if search in hits:
            out[i] = hits[search]
    return out


def _rows(s: Statement) -> list[tuple[Any, ...]]:
    return fetch_all([s])[0][0]


def _found(search: Search) -> Callable[[], list[Any]]:
    if isinstance(search, ChunkSearch):
        return search.found
    return lambda: search.hits(rows_of(fetch_all([search.statement()])[0]))


class SearchBatch:
    """The searches of one retrieve call, run together (``run``: at once).

    Stores add theirs while they prepare (outside any transaction); the first store that
    asks for its result runs them all. A search nobody added beforehand runs then."""

    def __init__(self) -> None:
        self._pending: list[Search] = []
        self._done: dict[Search, Any] = {}

    def add(self, search: Search) -> None:
        if search not in self._done and search not in self._pending:
            self._pending.append(search)

    def result(self, search: Search) -> Any:
        if search not in self._done:
            self.add(search)
            pending, self._pending = self._pending, []
            self._done.update(zip(pending, run(pending)))
        return self._done.pop(search)
