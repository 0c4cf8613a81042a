"""The vector leg: the ``pool`` rows of a scope nearest the query vector, nearest first.

The rule it keeps: a search returns min(pool, matching) rows. An HNSW walk with a filter
applied afterwards can return fewer rows or none (the index hands back its ``ef_search``
nearest rows, and the filter may drop them all), so a small scope takes an exact scan, a
large one walks the index of its dimension (pgvector 0.8's iterative scan goes on until
it has the rows wanted), and a walk that comes back short is redone exactly, in the
same statement (a CTE the planner skips when the walk was long enough). Rows still
waiting for a background indexer (a collection's ``pending`` column) are ranked exactly
beside the walk, so a row is found from the moment its write commits.

Which scopes are small: up to the collection's ``exact_max`` rows, or, past it, a scope
that holds less than ``walk_min_share`` of the table and at most ``exact_cap`` rows (a
walk filtered to a rare scope visits about as many graph nodes as the scope is rare in
the table: 10,000 facts among 1M are ranked faster exactly). A scope of unknown size (a
filter) is counted in the statement, up to ``exact_max`` + 1 rows.
"""

from __future__ import annotations

from typing import Any

from knowledge.retrieval import hnsw
from knowledge.retrieval.db import VectorParam
from knowledge.retrieval.engine import Collection, Leg, Scope


def _walk(c: Collection, scope: Scope) -> bool | None:
    """Whether the scope is walked through the index (None: counted in the statement)."""
    if scope.rows is None:
        return None
    if scope.rows <= c.exact_max:
        return False
    share = scope.rows / max(hnsw.row_count(c.table), 1.0)
    return share >= c.walk_min_share or scope.rows > c.exact_cap


def vector_leg(c: Collection, scope: Scope, dims: int, vector: Any, pool: int) -> Leg:
    """A statement giving (id, cosine distance, walked) of the ``pool`` rows of ``scope``
    nearest ``vector``, nearest first (ties by id); distances are those of the stored
    vectors; ``walked``: the row came from the index walk (false: an exact scan, or the
    rows waiting for the indexer)."""
    head = "WITH qv AS MATERIALIZED (SELECT %s::vector AS q)"
    params: list[Any] = [VectorParam(vector)]
    d = f"{c.embedding} <=> (SELECT q FROM qv)"
    exact = f"SELECT id, {d} AS d FROM {c.table} WHERE {scope.sql}"
    kind = hnsw.index_type(c.index_prefix, dims)
    walk = _walk(c, scope) if kind is not None else False
    if not walk and walk is not None:
        sql = (
            f"{head} SELECT id, {d} AS d, false AS walked FROM {c.table} WHERE {scope.sql}"
            f" ORDER BY d, id LIMIT {pool}"
        )
        return Leg(f"/* vector leg, exact */{sql}", [*params, *scope.params], [], "exact")
    gate, ctes = "", [head]
    if walk is None:
        # A scope of unknown size: its counter read, or its rows counted up to exact_max
        # + 1, in the statement; walked when it is not small.
        n = c.exact_max
        if scope.size is not None:
            rare = (
                f"n < {float(c.walk_min_share)} * (SELECT reltuples FROM pg_class"
                f" WHERE oid = '{c.table}'::regclass) AND n <= {int(c.exact_cap)}"
            )
            ctes.append(
                f"sm AS MATERIALIZED (SELECT n <= {n} OR ({rare}) AS yes"
                f" FROM (SELECT coalesce(({scope.size[0]}), 0) AS n) s)"
            )
            params += scope.size[1]
        else:
            ctes.append(
                f"sm AS MATERIALIZED (SELECT count(*) <= {n} AS yes FROM "
                f"(SELECT 1 FROM {c.table} WHERE {scope.sql} LIMIT {n + 1}) s)"
            )
            params += scope.params
        gate = " AND NOT (SELECT yes FROM sm)"
    pending = f" AND NOT {c.pending}" if c.pending else ""
    # The walk's scope is written so that no b-tree index can serve it: the scope is
    # large here, and a plan made without its values (a generic one) must still walk.
    ctes.append(
        f"i AS MATERIALIZED (SELECT id, {c.embedding}::vector({dims}) <=> (SELECT q FROM qv) AS d"
        f" FROM {c.table} WHERE {c.dims_column} = {dims}{pending} AND ({scope.sql}) IS TRUE"
        f"{gate} ORDER BY {c.embedding}::{kind}({dims}) <=> (SELECT q::{kind}({dims}) FROM qv)"
        f" LIMIT {pool})"
    )
    params += scope.params
    found = "SELECT id, d, true AS walked FROM i"
    if c.pending:
        ctes.append(
            f"p AS MATERIALIZED ({exact} AND {c.pending}{gate} ORDER BY d, id LIMIT {pool})"
        )
        params += scope.params
        found += " UNION ALL SELECT id, d, false FROM p"
    ctes.append(
        f"e AS MATERIALIZED ({exact} AND (SELECT count(*) FROM i) < {pool}"
        f" ORDER BY d, id LIMIT {pool})"
    )
    params += scope.params
    sql = (
        ",\n".join(ctes) + f"\nSELECT * FROM ({found}) x WHERE (SELECT count(*) FROM i) >= "
        f"{pool} UNION ALL SELECT id, d, false FROM e ORDER BY d, id LIMIT {pool}"
    )
    path = "index" if walk else "filtered"
    local = [
        *hnsw.walk_settings(c.index_prefix, dims, pool),
        ("max_parallel_workers_per_gather", 0),
    ]
    return Leg(f"/* vector leg, {path} */{sql}", params, local, path)
