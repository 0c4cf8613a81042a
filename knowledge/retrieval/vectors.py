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
filter) is counted in the statement, up to ``exact_max`` + 1 rows (``exact_cap`` + 1 where
rare scopes are ranked exactly).
"""

from __future__ import annotations

from typing import Any

from knowledge.retrieval import hnsw
from knowledge.retrieval.db import Setting, Statement, VectorParam
from knowledge.retrieval.engine import Collection, Leg, Scope, with_pinned

# Twice the most a copy's ranking distance can differ from the cosine distance of the
# 32-bit vectors. The copies are unit vectors rounded to 11 significant bits, each within
# r = 2^-11 + 2^-25 sqrt(n) of the exact unit vector, so their inner product is within
# 2r + r^2 (< 0.00098 up to 1,024 dimensions) of the cosine; float32 sums add at most
# n x 2^-24 per sum (< 0.00025 for both distances): 0.0013 < 0.002.
COPY_MARGIN = 0.004


def _walk(c: Collection, scope: Scope) -> bool | None:
    """Whether the scope is walked through the index (None: counted in the statement)."""
    if scope.rows is None:
        return None
    if scope.rows <= c.exact_max:
        return False
    share = scope.rows / max(hnsw.row_count(c.table), 1.0)
    return share >= c.walk_min_share or scope.rows > c.exact_cap


# A walked scope holding less than this share of its table can come back short of the
# rows wanted (a walk reads about rows / share tuples, up to hnsw.MAX_SCAN_TUPLES): its
# redo then ranks the scope from the copies, 13-28 ms for the 30,000-60,000 chunks of a
# tenant at 1M, where the table's rows would take five times that.
RARE_SHARE = 0.1


def _rare(c: Collection, scope: Scope) -> bool:
    return scope.rows is not None and scope.rows < RARE_SHARE * hnsw.row_count(c.table)


def _copies(c: Collection, scope: Scope, dims: int) -> bool:
    return (
        bool(c.copies)
        and scope.in_copies
        and dims <= c.copies_max_dims
        and hnsw.table_exists(c.copies)
    )


def _exact(
    c: Collection, scope: Scope, dims: int, pool: int, gate: str, copies: bool = True
) -> tuple[str, list[Any]]:
    """CTE ``e``: the ``pool`` rows of the scope nearest the query by the exact distance of
    their stored vectors, (d, id) order; nothing when ``gate`` (an uncorrelated condition)
    is false.

    With 16-bit copies (``Collection.copies``: unit vectors as ``halfvec`` in a table of
    the scope's columns, in scope order): ``hv`` ranks the scope's range of the copies by
    ``hd``, minus their inner product with the unit query (the cosine distance less 1),
    and keeps the best ``n``; every row whose exact distance can make the ``pool`` best has
    ``hd`` within ``COPY_MARGIN`` of the ``pool``-th best ``hd`` (each copy's distance is
    within half the margin of the exact one); those (``band``) are ranked by the exact
    distance of their 32-bit vectors, a few more rows than ``pool``, each found by its
    primary key. When the band runs past the ``n`` kept (distances closer than the margin,
    as near duplicates are), the range is read again for the whole band."""
    d = f"{c.embedding} <=> (SELECT q FROM qv)"
    if not (copies and _copies(c, scope, dims)):
        sql = (
            f"e AS MATERIALIZED (SELECT id, {d} AS d, {c.time} AS o FROM {c.table}"
            f" WHERE {scope.sql} AND {gate} ORDER BY d, id LIMIT {pool})"
        )
        return sql, list(scope.params)
    n = 2 * pool + 100
    half = "half <#> (SELECT l2_normalize(q)::halfvec FROM qv)"
    rows = f"FROM {c.copies} WHERE {scope.sql} AND {gate}"
    sql = (
        f"hv AS MATERIALIZED (SELECT id, {half} AS hd, {c.time} AS o {rows} ORDER BY hd"
        f" LIMIT {n}),\n"
        f"cut AS MATERIALIZED (SELECT t, (SELECT count(*) FROM hv) = {n}"
        " AND (SELECT max(hd) FROM hv) <= t AS more FROM (SELECT coalesce((SELECT hd"
        f" FROM hv ORDER BY hd OFFSET {pool - 1} LIMIT 1) + {COPY_MARGIN}, 'NaN') AS t) x),\n"
        "band AS (SELECT id, o FROM hv WHERE hd <= (SELECT t FROM cut)"
        f" AND NOT (SELECT more FROM cut) UNION ALL SELECT id, {c.time} {rows}"
        f" AND (SELECT more FROM cut) AND {half} <= (SELECT t FROM cut)),\n"
        f"e AS MATERIALIZED (SELECT b.id, (SELECT {d} FROM {c.table} r WHERE r.id = b.id) AS d,"
        f" b.o FROM band b ORDER BY d, b.id LIMIT {pool})"
    )
    return sql, [*scope.params, *scope.params]


def _walk_sql(
    c: Collection, dims: int, kind: str, scope: str, limit: str, gate: str = "", also: str = ""
) -> str:
    """The walk of the index of ``dims`` (its type ``kind``): (id, exact distance, time
    ``o``, then ``also``) of the first ``limit`` rows meeting ``scope`` (and ``gate``) in
    the index's order, none waiting for the indexer. The scope is written so that no
    b-tree index can serve it: the scope is large here, and a plan made without its
    values (a generic one) must still walk."""
    pending = f" AND NOT {c.pending}" if c.pending else ""
    return (
        f"SELECT id, {c.embedding}::vector({dims}) <=> (SELECT q FROM qv) AS d, {c.time} AS o"
        f"{also} FROM {c.table} WHERE {c.dims_column} = {dims}{pending} AND ({scope}) IS TRUE{gate}"
        f" ORDER BY {c.embedding}::{kind}({dims}) <=> (SELECT q::{kind}({dims}) FROM qv)"
        f" LIMIT {limit}"
    )


def _walk_local(c: Collection, dims: int, pool: int) -> list[Setting]:
    """A walk's settings (its own, inside a caller's transaction too: no parallel workers)."""
    return [
        *hnsw.walk_settings(c.index_prefix, dims, pool, c.ef_search or hnsw.EF_SEARCH),
        ("max_parallel_workers_per_gather", 0),
    ]


# A walk shared by several scopes reads this many times the rows they want together: at
# equal shares each scope then had its own rows in 384 of 384 searches of the stores'
# bench, where reading just the rows they want together left 190 of 384 short.
SHARED_SLACK = 1.5


def shared_walk(
    c: Collection, dims: int, vector: Any, pool: int, key: str, walked: tuple[str, list[Any]],
    also: str = "true",
) -> Statement:  # fmt: skip
    """One walk of the index of ``dims`` for several scopes, each the rows whose column
    ``key`` holds one value (and ``also``): ``walked`` (SQL and parameters) gives one row,
    ``keys``, the values of the scopes to walk. Rows (id, exact distance, true, time,
    key) in the index's order, ``SHARED_SLACK`` x ``pool`` per scope walked.

    The index hands its tuples in the same order whatever the filter (pgvector filters
    what it hands back), so the first ``pool`` rows of a scope among these are the rows a
    walk of that scope alone gives (the same ``ef_search``: ``walk_settings`` for
    ``pool``); a scope with fewer must walk alone, where its walk reads on."""
    kind = hnsw.index_type(c.index_prefix, dims)
    assert kind is not None, "a shared walk needs the index"
    assert not c.pending, "a shared walk ranks no row waiting for the indexer"
    keys = "(SELECT keys FROM ws)"
    limit = f"ceil({float(SHARED_SLACK)} * {int(pool)} * coalesce(cardinality({keys}), 0))::bigint"
    scope = f"{key} = ANY(ARRAY(SELECT unnest(keys) FROM ws)) AND {also}"
    walk = _walk_sql(c, dims, kind, scope, limit, also=f", {key} AS k")
    sql = (
        "/* shared walk */WITH qv AS MATERIALIZED (SELECT %s::vector AS q),\n"
        f"ws AS MATERIALIZED ({walked[0]}),\ni AS MATERIALIZED ({walk})\n"
        "SELECT id, d, true AS walked, o, k FROM i"
    )
    # (and the plan policy of every search statement: a plan that sorted the scope instead
    # of walking would hand back the exact order, not the index's)
    local = with_pinned(_walk_local(c, dims, pool))
    return Statement(sql, [VectorParam(vector), *walked[1]], True, local)


def vector_leg(c: Collection, scope: Scope, dims: int, vector: Any, pool: int) -> Leg:
    """A statement giving (id, cosine distance, walked, time) of the ``pool`` rows of
    ``scope`` nearest ``vector``, nearest first (ties by id); distances are those of the
    stored vectors; ``walked``: the row came from the index walk (false: an exact scan,
    the rows waiting for the indexer, or the scope's ``extra`` rows, always ranked
    exactly); time: the collection's ``time`` column."""
    ctes = ["qv AS MATERIALIZED (SELECT %s::vector AS q)"]
    params: list[Any] = [VectorParam(vector)]
    kind = hnsw.index_type(c.index_prefix, dims)
    walk = _walk(c, scope) if kind is not None else False
    gate = ""
    if walk is None:
        # A scope of unknown size: its counter read, or its rows counted in the
        # statement (up to exact_max + 1, or exact_cap + 1 where rare scopes are ranked
        # exactly); walked when it is not small.
        n = c.exact_max
        rare = (
            f"n < {float(c.walk_min_share)} * (SELECT reltuples FROM pg_class"
            f" WHERE oid = '{c.table}'::regclass) AND n <= {int(c.exact_cap)}"
        )
        if scope.size is not None:
            ctes.append(
                f"sm AS MATERIALIZED (SELECT n <= {n} OR ({rare}) AS yes"
                f" FROM (SELECT coalesce(({scope.size[0]}), 0) AS n) s)"
            )
            params += scope.size[1]
        else:
            most = max(n, c.exact_cap) if c.walk_min_share > 0 else n  # (past it: no change)
            ctes.append(
                f"sm AS MATERIALIZED (SELECT n <= {n} OR ({rare}) AS yes FROM (SELECT count(*)"
                f" AS n FROM (SELECT 1 FROM {c.table} WHERE {scope.sql} LIMIT {most + 1}) x) s)"
            )
            params += scope.params
        gate = " AND NOT (SELECT yes FROM sm)"
    found = ""
    if walk is not False:
        walk_sql = _walk_sql(c, dims, str(kind), scope.sql, str(pool), gate)
        ctes.append(f"i AS MATERIALIZED ({walk_sql})")
        params += scope.params
        found = "SELECT id, d, true AS walked, o FROM i"
        if c.pending:
            ctes.append(
                f"p AS MATERIALIZED (SELECT id, {c.embedding} <=> (SELECT q FROM qv) AS d,"
                f" {c.time} AS o FROM {c.table} WHERE {scope.sql} AND {c.pending}{gate}"
                f" ORDER BY d, id LIMIT {pool})"
            )
            params += scope.params
            found += " UNION ALL SELECT id, d, false, o FROM p"
        found = f"SELECT * FROM ({found}) w WHERE (SELECT count(*) FROM i) >= {pool} UNION ALL "
    # A walk that comes back short (it read hnsw.MAX_SCAN_TUPLES first) is redone from the
    # copies where that can happen: a scope of unknown size, or one rarer in its table
    # than RARE_SHARE. The copies' four CTEs cost a walk's statement a tenth of a
    # millisecond to start; a scope of a third of the table, whose walk does not come
    # back short, keeps the table for its redo.
    exact, exact_params = _exact(
        c, scope, dims, pool, "true" if walk is False else f"(SELECT count(*) FROM i) < {pool}",
        copies=walk is not True or _rare(c, scope),
    )  # fmt: skip
    ctes.append(exact)
    params += exact_params
    also = ""
    if scope.extra is not None:
        ctes.append(
            f"x AS MATERIALIZED (SELECT id, {c.embedding} <=> (SELECT q FROM qv) AS d,"
            f" {c.time} AS o FROM {c.table} WHERE {c.dims_column} = {dims} AND {scope.extra[0]})"
        )
        params += scope.extra[1]
        also = " UNION ALL SELECT id, d, false, o FROM x"
    path = "exact" if walk is False else "index" if walk else "filtered"
    sql = (
        f"/* vector leg, {path} */WITH " + ",\n".join(ctes)
        + f"\n{found}SELECT id, d, false AS walked, o FROM e{also} ORDER BY d, id LIMIT {pool}"
    )  # fmt: skip
    # What the fusion may measure a keyword candidate the leg did not hand over against:
    # the query, and the rows the leg ranks.
    query, within = params[0], (scope.sql, list(scope.params))
    if scope.extra is not None:
        within = (f"({scope.sql}) OR ({scope.extra[0]})", [*scope.params, *scope.extra[1]])
    if walk is False:
        return Leg(sql, params, [], path, query=query, dims=dims, within=within)
    return Leg(sql, params, _walk_local(c, dims, pool), path, query=query, dims=dims, within=within)
