"""SQL shared by the stores that keep MemoryItem rows, under the store's lock."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection

from memories.stores.backends.base import StoreHit
from memories.stores.search import TABLE, Newest, run


def newest(store_id: Any, limit: int, since: datetime | None = None) -> list[StoreHit]:
    """A store's newest ``limit`` items (since ``since``), newest first, on its own."""
    return run([Newest(str(store_id), limit, since)])[0]


def trim(store_id: Any, *, max_items: int | None, before: datetime | None = None) -> int:
    """Delete the oldest items beyond ``max_items`` and those created before ``before``."""
    deleted = 0
    with connection.cursor() as cur:
        if max_items is not None:
            # The oldest items past the store's item count (kept by triggers, current in
            # this transaction) go through the (store, id) index, in one statement; an
            # OFFSET of max_items from the newest was planned as a scan and sort of the
            # table (21 ms at 10,000 items).
            cur.execute(
                f"DELETE FROM {TABLE} WHERE id = ANY(ARRAY(SELECT id FROM {TABLE} "
                "WHERE store_id = %s ORDER BY store_id, id LIMIT greatest((SELECT item_count "
                "FROM memory_stores_memorystore WHERE id = %s) - %s, 0)))",
                [store_id, store_id, max_items],
            )
            deleted += cur.rowcount
        if before is not None:
            cur.execute(
                f"DELETE FROM {TABLE} WHERE store_id = %s AND created_at < %s", [store_id, before]
            )
            deleted += cur.rowcount
    return deleted
