"""SQL shared by the stores that keep MemoryItem rows, under the store's lock."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache, lru_cache
from typing import Any, NamedTuple

import numpy as np
import psycopg
from django.conf import settings
from django.db import connection, transaction

from core.health import pgvector_supports_iterative_scan, pgvector_version
from knowledge.models import INDEXED_DIMENSIONS
from knowledge.selectors import chunk_nearest_sql
from memories.stores.backends.base import StoreHit

TABLE = "memory_stores_memoryitem"


def vector_literal(vector: Any) -> str:
    # 7 significant digits hold a float32; the literal is sent in the query text.
    return "[" + ",".join(map("{:.7g}".format, np.asarray(vector, dtype=float).tolist())) + "]"


def _hit(row: tuple[Any, ...], distance: float | None = None) -> StoreHit:
    item_id, summary, metadata, created_at = row[:4]
    if isinstance(metadata, str):  # Django's connection hands jsonb over as text
        metadata = json.loads(metadata)
    similarity = None if distance is None else 1.0 - distance
    return StoreHit(
        id=str(item_id),
        content=summary,
        score=similarity,
        similarity=similarity,
        metadata=metadata or {},
        created_at=created_at,
    )


@lru_cache(maxsize=1)
def _iterative_scan() -> bool:
    return pgvector_supports_iterative_scan(pgvector_version())


_sizes: dict[str, tuple[bool, float]] = {}
SIZE_TTL = 60.0


def _small(store_id: Any) -> bool:
    """Whether the store has at most ``MEMORY_STORE_EXACT_MAX_ITEMS`` items; remembered for
    a minute per process (either path is correct, the choice is only about speed)."""
    key, now = str(store_id), time.monotonic()
    cached = _sizes.get(key)
    if cached is not None and now - cached[1] < SIZE_TTL:
        return cached[0]
    limit = settings.MEMORY_STORE_EXACT_MAX_ITEMS
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {TABLE} WHERE store_id = %s LIMIT %s) s",
            [store_id, limit + 1],
        )
        small = int(cur.fetchone()[0]) <= limit
    _sizes[key] = (small, now)
    return small


@dataclass(frozen=True)
class Nearest:
    """One store's vector search: the ``limit`` items nearest ``vector`` (float64
    bytes, so that searches compare and hash) by cosine, at most ``max_distance`` away
    (None: no cut); ``dims`` is the store's dimension."""

    store_id: str
    vector: bytes
    limit: int
    max_distance: float | None
    dims: int | None

    @classmethod
    def of(
        cls, store_id: Any, vector: Any, limit: int, max_distance: float | None, dims: int | None
    ) -> Nearest:
        data = np.asarray(vector, dtype=np.float64).tobytes()
        return cls(str(store_id), data, limit, max_distance, dims)

    @property
    def literal(self) -> str:
        return vector_literal(np.frombuffer(self.vector, dtype=np.float64))


@dataclass(frozen=True)
class ChunkNearest:
    """A file store's vector search: the ``limit`` chunks of its knowledge base nearest
    ``vector`` (float64 bytes), at most ``max_distance`` away; ``rows`` is the base's
    chunk count (its counter: no query), which picks the path as for items."""

    knowledge_base_id: str
    vector: bytes
    limit: int
    max_distance: float | None
    dims: int
    rows: int

    @classmethod
    def of(
        cls, kb_id: Any, vector: Any, limit: int, max_distance: float | None, dims: int, rows: int
    ) -> ChunkNearest:
        data = np.asarray(vector, dtype=np.float64).tobytes()
        return cls(str(kb_id), data, limit, max_distance, dims, rows)

    @property
    def indexed(self) -> bool:
        """Through the chunks' HNSW index: a base of more than
        ``MEMORY_STORE_EXACT_MAX_ITEMS`` chunks (the stores' rule, which is not
        knowledge's ``SEARCH_EXACT_MAX_ROWS``), of an indexed dimension."""
        return self.dims in INDEXED_DIMENSIONS and self.rows > settings.MEMORY_STORE_EXACT_MAX_ITEMS

    def statement(self, index: bool) -> tuple[str, list[Any]]:
        literal = vector_literal(np.frombuffer(self.vector, dtype=np.float64))
        return chunk_nearest_sql(
            knowledge_base_id=self.knowledge_base_id,
            dims=self.dims,
            vector=literal,
            limit=self.limit,
            index=index,
        )


@dataclass(frozen=True)
class ChunkHit:
    id: int
    text: str
    file_path: str
    chunk_index: int
    similarity: float


def _chunk_hits(
    search: ChunkNearest, rows: list[tuple[Any, ...]], index: bool
) -> list[ChunkHit] | None:
    """The search's hits from its statement's rows, or None when the index's own rows
    came back short (the caller redoes it exactly)."""
    if index and sum(1 for row in rows if not row[5]) < search.limit:
        return None
    cut = None if search.max_distance is None else search.max_distance + 1e-9
    return [
        ChunkHit(row[0], row[1], row[2], row[3], 1.0 - float(row[4]))
        for row in rows[: search.limit]
        if cut is None or float(row[4]) <= cut
    ]


@cache
def _index_type(dims: int) -> str | None:
    """The type the HNSW index of ``dims`` is built on: ``halfvec`` (migration 0003, on
    pgvector >= 0.7), else ``vector`` (0002's index, kept on older pgvector)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
            [f"memoryitem_hnsw_half_{dims}", f"memoryitem_hnsw_{dims}"],
        )
        half, full = cur.fetchone()
    return "halfvec" if half else "vector" if full else None


def _ef(limit: int) -> int:
    return max(settings.MEMORY_STORE_EF_SEARCH, limit * 2)


# How a search runs: "exact" (a scan of the store's rows), "index" (the HNSW index
# walked for this store alone) or "shared" (one walk for every store of the statement
# with the same dimension and query vector).
Path = str


def _branch(n: int, search: Nearest, vec: str, path: Path) -> tuple[str, list[Any]]:
    """The SELECT of one search in the UNION (``vec``: the CTE column of its vector).

    Index path: the HNSW index of the store's dimension, filtered to the store
    (pgvector's iterative scan keeps walking the graph until ``limit`` rows of the
    store are found); it ranks by the index's type (``halfvec``: 16-bit floats), and the
    distance handed back is the exact one of the stored vectors, which orders the
    result. Exact path: ordering by the uncast column never uses the indexes.
    """
    if path == "index":
        dims, kind = search.dims, _index_type(search.dims or 0)
        sql = (
            f"(SELECT {n} AS k, id, embedding::vector({dims}) <=> (SELECT {vec} FROM q) AS d "
            f"FROM {TABLE} WHERE dimensions = {dims} AND store_id = %s ORDER BY "
            f"embedding::{kind}({dims}) <=> (SELECT {vec}::{kind}({dims}) FROM q) LIMIT %s)"
        )
        return sql, [search.store_id, search.limit]
    cut = (
        f" AND embedding <=> (SELECT {vec} FROM q) <= %s" if search.max_distance is not None else ""
    )
    sql = (
        f"(SELECT {n} AS k, id, embedding <=> (SELECT {vec} FROM q) AS d FROM {TABLE} "
        f"WHERE store_id = %s AND embedding IS NOT NULL{cut} ORDER BY d, id LIMIT %s)"
    )
    params = [search.store_id] + ([search.max_distance] if search.max_distance is not None else [])
    return sql, [*params, search.limit]


SHARED_ROWS = 2  # a shared walk reads this many times the rows its stores want in all


def _shared_branch(members: list[tuple[int, Nearest]], vec: str) -> tuple[str, list[Any]]:
    """One HNSW walk for several stores searched with the same vector.

    A walk does not depend on the filter: each store's own scan would walk the same
    graph and hand back, in the same order, the rows of its store. So the rows of all
    the stores, in the walk's order (``pos``), give each store the first ``limit`` rows
    its own scan would have given, if the walk reached that many of them; a store that
    got fewer is searched again on its own (``nearest_many``).
    """
    dims = members[0][1].dims
    kind = _index_type(dims or 0)
    wanted = sum(search.limit for _, search in members)
    stores = ", ".join(f"(%s::uuid, {n}, {search.limit})" for n, search in members)
    sql = (
        "(SELECT m.k, w.id, w.d FROM (SELECT s.id, s.store_id, s.d, row_number() OVER "
        "(PARTITION BY s.store_id ORDER BY s.pos) AS r FROM (SELECT t.*, row_number() OVER () "
        f"AS pos FROM (SELECT id, store_id, embedding::vector({dims}) <=> (SELECT {vec} FROM q) "
        f"AS d FROM {TABLE} WHERE dimensions = {dims} AND store_id = ANY(%s::uuid[]) ORDER BY "
        f"embedding::{kind}({dims}) <=> (SELECT {vec}::{kind}({dims}) FROM q) LIMIT %s) t) s) w "
        f"JOIN (VALUES {stores}) m(store_id, k, lim) ON m.store_id = w.store_id WHERE w.r <= m.lim)"
    )
    ids = [search.store_id for _, search in members]
    return sql, [ids, wanted * SHARED_ROWS, *ids]


def _settings(ef: int) -> tuple[str, list[Any]]:
    if _iterative_scan():
        return (
            "SELECT set_config('hnsw.ef_search', %s, true), "
            "set_config('hnsw.iterative_scan', 'strict_order', true), "
            "set_config('hnsw.max_scan_tuples', %s, true)",
            [str(ef), str(settings.SEARCH_MAX_SCAN_TUPLES)],
        )
    return "SELECT set_config('hnsw.ef_search', %s, true)", [str(ef)]


def _statement(group: list[tuple[int, Nearest, Path]]) -> tuple[str, list[Any]]:
    """One SELECT for a group of searches: their vectors once each (CTE ``q``), one
    UNION ALL branch per search or shared walk, the details of the hits joined once."""
    literals: dict[bytes, tuple[str, str]] = {}  # vector -> (CTE column, literal)
    for _, search, _path in group:
        if search.vector not in literals:
            literals[search.vector] = (f"v{len(literals)}", search.literal)
    columns = ", ".join(f"%s::vector AS {name}" for name, _ in literals.values())
    branches, params = [], []
    shared: dict[tuple[Any, bytes], list[tuple[int, Nearest]]] = {}
    for n, search, path in group:
        if path == "shared":
            shared.setdefault((search.dims, search.vector), []).append((n, search))
            continue
        sql, branch_params = _branch(n, search, literals[search.vector][0], path)
        branches.append(sql)
        params += branch_params
    for (_, vector), members in shared.items():
        sql, branch_params = _shared_branch(members, literals[vector][0])
        branches.append(sql)
        params += branch_params
    sql = (
        f"WITH q AS MATERIALIZED (SELECT {columns}), "
        f"c AS MATERIALIZED ({' UNION ALL '.join(branches)}) "
        "SELECT c.k, i.id, i.content_summary, i.metadata, i.created_at, c.d FROM c "
        f"JOIN {TABLE} i ON i.id = c.id ORDER BY c.k, c.d, c.id"
    )
    return sql, [*(literal for _, literal in literals.values()), *params]


@dataclass(frozen=True)
class Newest:
    """A store's newest ``limit`` items, created at ``since`` or later (None: any)."""

    store_id: str
    limit: int
    since: datetime | None = None

    def statement(self) -> tuple[str, list[Any]]:
        age = " AND created_at >= %s" if self.since is not None else ""
        params: list[Any] = [self.store_id] + ([self.since] if self.since is not None else [])
        sql = (
            f"SELECT id, content_summary, metadata, created_at FROM {TABLE} "
            f"WHERE store_id = %s{age} ORDER BY id DESC LIMIT %s"
        )
        return sql, [*params, self.limit]


class Found(NamedTuple):
    items: list[list[StoreHit]]
    chunks: list[list[ChunkHit]]
    newest: list[list[StoreHit]]


def _run(searches: list[tuple[Nearest, Path]]) -> list[list[StoreHit]]:
    """Each items' search's hits, nearest first, in one round trip (``_run_all``)."""
    return _run_all(searches, [])[0]


def _run_all(
    searches: list[tuple[Nearest, Path]],
    chunks: list[tuple[ChunkNearest, bool]],
    newest: Sequence[Newest] = (),
) -> tuple[list[list[StoreHit]], list[list[ChunkHit] | None], list[list[StoreHit]]]:
    """Every search in one round trip: index searches grouped by the ``hnsw.ef_search``
    they need, each group's settings local to the transaction (``SET LOCAL``), all the
    statements sent as one query string when the cursor binds on the client (Django's
    default); one statement at a time otherwise. Items' hits of each search nearest
    first; chunks' (``(search, through the index)``) likewise, or None for an index
    answer that came back short; ``newest``'s items newest first."""
    groups: dict[int, list[tuple[int, Nearest, Path]]] = {}
    for n, (search, path) in enumerate(searches):
        ef = _ef(search.limit) if path != "exact" else 0
        groups.setdefault(ef, []).append((n, search, path))
    chunk_groups: dict[int, list[int]] = {}
    for n, (chunk, through_index) in enumerate(chunks):
        chunk_groups.setdefault(_ef(chunk.limit) if through_index else 0, []).append(n)
    # (sql, params, what its rows are: None, ("items",), ("chunks", n) or ("newest", n))
    statements: list[tuple[str, list[Any], tuple[Any, ...] | None]] = []
    statements += [(*recent.statement(), ("newest", n)) for n, recent in enumerate(newest)]
    for ef in sorted(set(groups) | set(chunk_groups)):
        if ef:
            statements.append((*_settings(ef), None))
        if ef in groups:
            statements.append((*_statement(groups[ef]), ("items",)))
        for n in chunk_groups.get(ef, []):
            statements.append((*chunks[n][0].statement(chunks[n][1]), ("chunks", n)))
    out: list[list[StoreHit]] = [[] for _ in searches]
    chunk_out: list[list[ChunkHit] | None] = [None for _ in chunks]
    newest_out: list[list[StoreHit]] = [[] for _ in newest]

    def collect(rows: list[tuple[Any, ...]], wanted: tuple[Any, ...]) -> None:
        if wanted[0] == "chunks":
            search, index = chunks[wanted[1]]
            chunk_out[wanted[1]] = _chunk_hits(search, rows, index)
            return
        if wanted[0] == "newest":
            newest_out[wanted[1]] = [_hit(row) for row in rows]
            return
        for row in rows:
            out[row[0]].append(_hit(row[1:5], float(row[5])))

    # SET LOCAL needs a transaction: the caller's, if it holds one (a retrieve call
    # does); else, on a client-binding cursor, the implicit transaction of a
    # multi-statement query; else one of our own (no savepoint: this only reads).
    with connection.cursor() as cur:
        if isinstance(cur.cursor, psycopg.ClientCursor):
            sql = "; ".join(s for s, _, _ in statements)
            cur.execute(sql, [p for _, params, _ in statements for p in params])
            for index, (_, _, wanted) in enumerate(statements):
                if index:
                    cur.nextset()
                if wanted:
                    collect(cur.fetchall(), wanted)
        else:
            with transaction.atomic(savepoint=False):
                for sql, params, wanted in statements:
                    cur.execute(sql, params)
                    if wanted:
                        collect(cur.fetchall(), wanted)
    return out, chunk_out, newest_out


def nearest_many(searches: list[Nearest]) -> list[list[StoreHit]]:
    """Each items' search's hits, nearest first, in one round trip (``nearest_all``)."""
    return nearest_all(searches, [])[0]


def nearest_all(
    searches: list[Nearest], chunks: list[ChunkNearest], newest: Sequence[Newest] = ()
) -> Found:
    """Each search's hits, nearest first, all searches in one round trip (the items'
    searches and the file stores' chunk searches alike; and ``newest``'s reads).

    Stores of up to ``MEMORY_STORE_EXACT_MAX_ITEMS`` items (or chunks) are scanned
    exactly; larger ones go through the HNSW index of their dimension (approximate: its
    recall is in BENCHMARKS.md), one walk for the item stores searched with the same
    vector, and an index scan that comes back short is redone exactly.
    """
    if not searches and not chunks and not newest:
        return Found([], [], [])
    indexed = [
        s.dims is not None
        and s.dims in INDEXED_DIMENSIONS
        and _index_type(s.dims) is not None
        and not _small(s.store_id)
        for s in searches
    ]
    # Index searches with the same ef_search, dimension and vector share one walk.
    walks = Counter((_ef(s.limit), s.dims, s.vector) for s, on in zip(searches, indexed) if on)
    paths: list[Path] = [
        "exact" if not on else "shared" if walks[(_ef(s.limit), s.dims, s.vector)] > 1 else "index"
        for s, on in zip(searches, indexed)
    ]
    results, found, recent = _run_all(
        list(zip(searches, paths)), [(c, c.indexed) for c in chunks], newest
    )
    alone = [
        n
        for n, hits in enumerate(results)
        if paths[n] == "shared" and len(hits) < searches[n].limit
    ]
    short_chunks = [n for n, hits in enumerate(found) if hits is None]
    again, exact_chunks, _ = (
        _run_all(
            [(searches[n], "index") for n in alone],
            [(chunks[n], False) for n in short_chunks],
        )
        if alone or short_chunks
        else ([], [], [])
    )
    for n, hits in zip(alone, again):
        results[n] = hits
    for n, chunk_hits in zip(short_chunks, exact_chunks):
        found[n] = chunk_hits
    short = [n for n, hits in enumerate(results) if indexed[n] and len(hits) < searches[n].limit]
    for n, hits in zip(short, _run([(searches[n], "exact") for n in short]) if short else []):
        results[n] = hits
    for n, search in enumerate(searches):
        if indexed[n] and n not in short and search.max_distance is not None:
            cut = search.max_distance + 1e-9
            results[n] = [h for h in results[n] if 1.0 - (h.similarity or 0.0) <= cut]
    return Found(results, [hits or [] for hits in found], recent)


def nearest(
    store_id: Any, vector: Any, limit: int, max_distance: float | None, *, dims: int | None
) -> list[StoreHit]:
    """The ``limit`` items nearest by cosine, at most ``max_distance`` away (one search
    of ``nearest_many``)."""
    return nearest_many([Nearest.of(store_id, vector, limit, max_distance, dims)])[0]


Search = Nearest | ChunkNearest | Newest


class SearchBatch:
    """The vector searches of one retrieve call, run together in one round trip.

    Stores add theirs while they prepare (outside any transaction): items' searches
    (``Nearest``), file stores' chunk searches (``ChunkNearest``) and a blackboard's
    newest entries (``Newest``); the first store that asks for its result runs them all. A search nobody added beforehand runs then,
    on its own."""

    def __init__(self) -> None:
        self._pending: list[Search] = []
        self._done: dict[Search, Any] = {}

    def add(self, search: Search) -> None:
        if search not in self._done and search not in self._pending:
            self._pending.append(search)

    def _result(self, search: Search) -> Any:
        if search not in self._done:
            self.add(search)
            pending, self._pending = self._pending, []
            items = [s for s in pending if isinstance(s, Nearest)]
            chunks = [s for s in pending if isinstance(s, ChunkNearest)]
            recent = [s for s in pending if isinstance(s, Newest)]
            found = nearest_all(items, chunks, recent)
            self._done.update(zip(items, found.items))
            self._done.update(zip(chunks, found.chunks))
            self._done.update(zip(recent, found.newest))
        return self._done.pop(search)

    def result(self, search: Nearest) -> list[StoreHit]:
        return self._result(search)  # type: ignore[no-any-return]

    def chunk_result(self, search: ChunkNearest) -> list[ChunkHit]:
        return self._result(search)  # type: ignore[no-any-return]

    def newest_result(self, search: Newest) -> list[StoreHit]:
        return self._result(search)  # type: ignore[no-any-return]


def newest(store_id: Any, limit: int, since: datetime | None = None) -> list[StoreHit]:
    """A store's newest ``limit`` items (since ``since``), newest first, on its own."""
    sql, params = Newest(str(store_id), limit, since).statement()
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [_hit(row) for row in cur.fetchall()]


def trim(store_id: Any, *, max_items: int | None, before: datetime | None = None) -> int:
    """Delete the oldest items beyond ``max_items`` and those created before ``before``."""
    deleted = 0
    with connection.cursor() as cur:
        if max_items is not None:
            cur.execute(
                f"DELETE FROM {TABLE} WHERE store_id = %s AND id <= (SELECT id FROM {TABLE} "
                "WHERE store_id = %s ORDER BY id DESC OFFSET %s LIMIT 1)",
                [store_id, store_id, max_items],
            )
            deleted += cur.rowcount
        if before is not None:
            cur.execute(
                f"DELETE FROM {TABLE} WHERE store_id = %s AND created_at < %s", [store_id, before]
            )
            deleted += cur.rowcount
    return deleted
