"""SQL shared by the stores that keep MemoryItem rows, under the store's lock."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import numpy as np
from django.db import connection

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


def nearest(store_id: Any, vector: Any, limit: int, max_distance: float | None) -> list[StoreHit]:
    """The ``limit`` items nearest by cosine (exact scan of this store's rows)."""
    vec = vector_literal(vector)
    cut = " AND embedding <=> %s::vector <= %s" if max_distance is not None else ""
    params: list[Any] = [vec, store_id]
    if max_distance is not None:
        params += [vec, max_distance]
    sql = (
        f"WITH c AS MATERIALIZED (SELECT id, embedding <=> %s::vector AS d FROM {TABLE} "
        f"WHERE store_id = %s AND embedding IS NOT NULL{cut} ORDER BY d, id LIMIT %s) "
        f"SELECT i.id, i.content_summary, i.metadata, i.created_at, c.d FROM c "
        f"JOIN {TABLE} i ON i.id = c.id ORDER BY c.d, c.id"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [*params, limit])
        return [_hit(row, float(row[4])) for row in cur.fetchall()]


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
