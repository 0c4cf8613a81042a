"""SQL shared by the stores that keep MemoryItem rows, under the store's lock."""

from __future__ import annotations

import json
import time
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection, transaction

from core.health import pgvector_supports_iterative_scan, pgvector_version
from knowledge.models import INDEXED_DIMENSIONS
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


_DETAILS = (
    "SELECT i.id, i.content_summary, i.metadata, i.created_at, c.d FROM c "
    f"JOIN {TABLE} i ON i.id = c.id ORDER BY c.d, c.id"
)


def _exact(store_id: Any, vec: str, limit: int, max_distance: float | None) -> list[StoreHit]:
    cut = " AND embedding <=> %s::vector <= %s" if max_distance is not None else ""
    params: list[Any] = [vec, store_id]
    if max_distance is not None:
        params += [vec, max_distance]
    # Ordering by the uncast column never uses the per-dimension indexes: an exact scan.
    sql = (
        f"WITH c AS MATERIALIZED (SELECT id, embedding <=> %s::vector AS d FROM {TABLE} "
        f"WHERE store_id = %s AND embedding IS NOT NULL{cut} ORDER BY d, id LIMIT %s) {_DETAILS}"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [*params, limit])
        return [_hit(row, float(row[4])) for row in cur.fetchall()]


def _indexed(store_id: Any, vec: str, dims: int, limit: int) -> list[StoreHit]:
    """The HNSW index of this dimension, filtered to the store (pgvector's iterative
    scan keeps walking the graph until ``limit`` rows of the store are found)."""
    sql = (
        f"WITH c AS MATERIALIZED (SELECT id, embedding::vector({dims}) <=> "
        f"%s::vector({dims}) AS d FROM {TABLE} WHERE dimensions = {dims} AND store_id = %s "
        f"ORDER BY d LIMIT %s) {_DETAILS}"
    )
    # SET LOCAL needs a transaction; inside the caller's (a retrieve call opens one for
    # all its stores) no savepoint is needed: this only reads.
    with transaction.atomic(savepoint=False), connection.cursor() as cur:
        ef = max(settings.MEMORY_STORE_EF_SEARCH, limit * 2)
        if _iterative_scan():
            cur.execute(
                "SELECT set_config('hnsw.ef_search', %s, true), "
                "set_config('hnsw.iterative_scan', 'strict_order', true), "
                "set_config('hnsw.max_scan_tuples', %s, true)",
                [str(ef), str(settings.SEARCH_MAX_SCAN_TUPLES)],
            )
        else:
            cur.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(ef)])
        cur.execute(sql, [vec, store_id, limit])
        return [_hit(row, float(row[4])) for row in cur.fetchall()]


def nearest(
    store_id: Any, vector: Any, limit: int, max_distance: float | None, *, dims: int | None
) -> list[StoreHit]:
    """The ``limit`` items nearest by cosine, at most ``max_distance`` away.

    Stores of up to ``MEMORY_STORE_EXACT_MAX_ITEMS`` items are scanned exactly; larger
    ones go through the HNSW index of their dimension (approximate: its recall is in
    BENCHMARKS.md), and an index scan that comes back short is redone exactly.
    """
    vec = vector_literal(vector)
    if dims in INDEXED_DIMENSIONS and not _small(store_id):
        hits = _indexed(store_id, vec, dims, limit)
        if len(hits) >= limit:
            if max_distance is not None:
                hits = [h for h in hits if 1.0 - (h.similarity or 0.0) <= max_distance + 1e-9]
            return hits
    return _exact(store_id, vec, limit, max_distance)


def newest(store_id: Any, limit: int, since: datetime | None = None) -> list[StoreHit]:
    age = " AND created_at >= %s" if since is not None else ""
    params: list[Any] = [store_id] + ([since] if since is not None else [])
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id, content_summary, metadata, created_at FROM {TABLE} "
            f"WHERE store_id = %s{age} ORDER BY id DESC LIMIT %s",
            [*params, limit],
        )
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
