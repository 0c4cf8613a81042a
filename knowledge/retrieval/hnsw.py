"""The HNSW indexes every collection walks: which type they are built on, how far a walk
looks (``ef_search``) and how it goes on when a filter drops what it found.

Every collection keeps one partial expression index per dimension on 16-bit floats,
``<prefix>_half_<dims>`` (``core.hnsw.halfvec_swap``), or on older pgvector the
``vector`` one, ``<prefix>_<dims>``. A walk ranks by the index's type; the distance a
search hands back is always the exact one of the stored vectors.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence

from django.db import connection

from core.health import pgvector_supports_iterative_scan, pgvector_version
from knowledge.models import INDEXED_DIMENSIONS
from knowledge.retrieval.db import Setting

# hnsw.ef_search for an index of up to EF_SCALE_ROWS rows: pgvector's 40 left recall@10
# at 0.967-0.978 on 100,000 chunks, 100 gives 0.99 (BENCHMARKS.md, "Knowledge retrieval");
# beyond, it grows with log10 of the index size (x2 at 1M: recall@10 0.93 -> 0.98), as a
# walk's path through the graph does. Always at least twice the rows wanted, at most
# pgvector's maximum.
EF_SEARCH = 100
EF_SCALE_ROWS = 100_000
EF_MAX = 1000
# A filtered walk goes on (pgvector >= 0.8's iterative scan, in strict distance order)
# until it has the rows wanted or has read this many tuples; a walk that comes back
# short is redone exactly by every collection (a rare scope from its 16-bit copies:
# vectors.RARE_SHARE). A walk needs about its rows / the scope's share of the index:
# 1,000 tuples for 50 rows of a 5% scope. At 1M chunks the walks filtered to a tenant
# of 3-6% (past 20,000 chunks: walked) that went on past 5,000 tuples took 40-134 ms,
# where the exact ranking of the tenant's copies takes 13-28: p95 halved, the median
# the same (BENCHMARKS.md, "A million chunks: no parallel workers, and room in shared
# buffers").
MAX_SCAN_TUPLES = 5_000
ROW_COUNT_TTL = 300.0  # seconds a planner row count (or a scope's size) is trusted
KEPT_MOST = 10_000  # counts a process keeps of one kind, at most (then it starts over)

_row_counts: dict[str, tuple[float, float]] = {}


def kept_counts(
    kept: dict[str, tuple[float, float]],
    keys: Sequence[str],
    load: Callable[[list[str]], dict[str, float]],
) -> dict[str, float]:
    """``keys``' counts, each read by ``load`` (one call for those not kept, 0 for a key it
    does not find) and kept in ``kept`` with the time it was read, ROW_COUNT_TTL seconds."""
    now = time.monotonic()
    if len(kept) > KEPT_MOST:
        kept.clear()
    stale = [k for k in keys if k not in kept or now - kept[k][1] >= ROW_COUNT_TTL]
    if stale:
        loaded = load(stale)
        kept.update((k, (loaded.get(k, 0.0), now)) for k in stale)
    return {k: kept[k][0] for k in keys}


@functools.cache
def iterative_scan() -> bool:
    return pgvector_supports_iterative_scan(pgvector_version())


@functools.cache
def index_type(prefix: str, dims: int) -> str | None:
    """``halfvec`` when ``<prefix>_half_<dims>`` exists, else ``vector`` when
    ``<prefix>_<dims>`` does, else None (no index: every search is exact)."""
    if dims not in INDEXED_DIMENSIONS:
        return None
    with connection.cursor() as cur:
        cur.execute(
            "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
            [f"{prefix}_half_{dims}", f"{prefix}_{dims}"],
        )
        half, full = cur.fetchone()
    return "halfvec" if half else "vector" if full else None


@functools.cache
def table_exists(name: str) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return bool(cur.fetchone()[0])


def index_name(prefix: str, dims: int) -> str:
    return f"{prefix}_half_{dims}" if index_type(prefix, dims) == "halfvec" else f"{prefix}_{dims}"


def row_count(relname: str) -> float:
    """Rows of the table or index ``relname`` (planner statistics), kept a while."""
    return kept_counts(_row_counts, [relname], _reltuples)[relname]


def _reltuples(names: list[str]) -> dict[str, float]:
    with connection.cursor() as cur:
        cur.execute("SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s)", [names])
        return {name: max(float(rows), 0.0) for name, rows in cur.fetchall()}


def ef_search(prefix: str, dims: int, limit: int, base: int = EF_SEARCH) -> int:
    """hnsw.ef_search for a walk of the index of ``dims`` wanting ``limit`` rows
    (``base``: a collection's own, up to ``EF_SCALE_ROWS`` rows; beyond, every
    collection's grows from ``EF_SEARCH``: a lower base was measured on small indexes
    only)."""
    ef = base
    rows = row_count(index_name(prefix, dims))
    if rows > EF_SCALE_ROWS:
        ef = round(max(base, EF_SEARCH) * (1 + math.log10(rows / EF_SCALE_ROWS)))
    return min(max(ef, limit * 2), EF_MAX)


def walk_settings(prefix: str, dims: int, limit: int, base: int = EF_SEARCH) -> list[Setting]:
    """The settings of a walk of the index of ``dims`` wanting ``limit`` rows."""
    local: list[Setting] = [("hnsw.ef_search", ef_search(prefix, dims, limit, base))]
    if iterative_scan():
        local += [
            ("hnsw.iterative_scan", "strict_order"),
            ("hnsw.max_scan_tuples", MAX_SCAN_TUPLES),
        ]
    return local
