"""How a scope's facts are ranked: the vector leg (exact through the 16-bit copies, or a
walk of the HNSW index), the keyword leg (BM25 with the scope's statistics), their
merge and the decay, as SQL (one statement: ``candidates_statement``, run by
``scope_fact_search``), and the nearest-fact lookups the duplicate check makes.

Moved here as it was (from ``memories.personal.selectors``; only table and model names
changed) so that it moves into the retrieval package in one step. What calls it:
``memories.facts.search`` (the one search of facts) and ``memories.facts.services``
(the duplicate check, eviction's size check).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from core.health import pgvector_supports_iterative_scan, pgvector_version
from core.hnsw import index_type
from knowledge.models import INDEXED_DIMENSIONS
from knowledge.retrieval import bm25, hnsw
from knowledge.retrieval import db as prepared

# --- Core facts of a scope (the engine's core tier) ----------------------------------
# A scope's facts are the vectors whose ``scope`` is that scope plus the shared ones
# reached through its ``shared`` links (few). The scope's own facts are ranked from its
# range of ``memories_fact_half`` (migration 0008: the columns ranking reads and a
# 16-bit copy of the vector, one index range: no heap visit per fact, whose rows lie
# scattered among every other scope's), the candidates re-ranked from their 32-bit
# vectors (``_exact_ctes``). Both legs are exact.

_SHARED_JOIN = (
    "memories_factlink uv JOIN memories_fact v ON v.id = uv.fact_id "
    "WHERE uv.scope_id = %s AND uv.shared AND v.scope_id IS NULL"
)

# The exact distance of one fact by its id: a subquery per candidate, so its row is
# always found through the primary key (a join could be planned as a scan of the table).
_EXACT_D = "(SELECT v.embedding <=> (SELECT qv FROM q) FROM memories_fact v WHERE v.id = {id})"
# Vectors of at most this many dimensions have a 16-bit copy (migration 0008's
# trigger: 2 kB of halfvec, within a btree tuple's 2,704 bytes).
HALF_MAX_DIMENSIONS = 1024
# Twice the most the 16-bit copies' ranking distance can differ from the cosine
# distance of the 32-bit vectors. The copies are unit vectors rounded to 11
# significant bits, each within r = 2^-11 + 2^-25 sqrt(n) of the exact unit vector, so
# their inner product is within 2r + r^2 (< 0.00098 up to 1,024 dimensions) of the
# cosine; float32 sums add at most n x 2^-24 per sum (< 0.00025 for both distances):
# 0.0013 < 0.002.
HALF_MARGIN = 0.004


@functools.cache
def _half_table() -> bool:
    """Whether ``memories_fact_half`` exists (not on pgvector < 0.7: migration 0008)."""
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('memories_fact_half') IS NOT NULL")
        row = cur.fetchone()
    return bool(row and row[0])


def _exact_ctes(
    *, scope_id: int, dims: int, embedding_model: str, where: str, fparams: list[Any],
    pool: int, gate: str = "true", rerank: bool = True,
) -> tuple[str, list[Any]]:  # fmt: skip
    """CTEs ending in ``ev`` (id, d, o, x): the ``pool`` facts of the scope itself
    nearest to ``q.qv`` by the cosine distance of their stored vectors, ordered by (d,
    id), as an exact scan ranks them; ``o`` is ``observed_at``; ``x`` says ``d`` is
    exact (always, unless ``rerank`` is False: then ``ev`` is the band below with the
    copies' distances, each within ``HALF_MARGIN`` / 2 of the exact one: every fact that
    can be among the ``pool`` nearest). ``gate``: an uncorrelated condition (a one-time
    filter: false reads nothing).

    With a 16-bit copy (``HALF_MAX_DIMENSIONS``): ``hv`` ranks the scope's range of
    ``memories_fact_half`` by ``hd``, minus the inner product of the copies (unit
    vectors: the cosine distance less 1), and keeps the best ``n``; every fact whose
    exact distance can make the ``pool`` best has ``hd`` within ``HALF_MARGIN`` of the
    ``pool``-th best ``hd`` (the ``pool`` best by ``hd`` are each within half the margin
    of their own exact distance); those (``band``) are re-ranked from their 32-bit
    vectors, a few more rows than ``pool``. When the band runs past the ``n`` kept
    (distances closer than the margin, as near duplicates are), the range is read
    again for the whole band. Without a copy: an exact scan of the scope's facts in the
    table."""
    if not (dims <= HALF_MAX_DIMENSIONS and _half_table()):
        sql = (
            "ev AS MATERIALIZED (SELECT id, embedding <=> (SELECT qv FROM q) AS d,"
            " observed_at AS o, true AS x FROM memories_fact WHERE scope_id = %s"
            f" AND dimensions = {dims} AND embedding_model = %s{where} AND {gate}"
            f" ORDER BY d, id LIMIT {int(pool)}), "
        )
        return sql, [scope_id, embedding_model, *fparams]
    n = 2 * pool + 100
    half = "half <#> (SELECT l2_normalize(qv)::halfvec FROM q)"  # (-(inner product))
    rows = (
        f"FROM memories_fact_half WHERE scope_id = %s AND dimensions = {dims}"
        f" AND embedding_model = %s{where} AND {gate}"
    )
    sql = (
        f"hv AS MATERIALIZED (SELECT id, {half} AS hd, observed_at AS o {rows}"
        f" ORDER BY hd LIMIT {n}), "
        f"cut AS MATERIALIZED (SELECT t, (SELECT count(*) FROM hv) = {n}"
        " AND (SELECT max(hd) FROM hv) <= t AS more FROM (SELECT coalesce((SELECT hd"
        f" FROM hv ORDER BY hd OFFSET {pool - 1} LIMIT 1) + %s, 'NaN') AS t) x), "
        "band AS (SELECT id, hd, o FROM hv WHERE hd <= (SELECT t FROM cut)"
        " AND NOT (SELECT more FROM cut) UNION ALL"
        f" SELECT id, {half}, observed_at {rows} AND (SELECT more FROM cut)"
        f" AND {half} <= (SELECT t FROM cut)), "
    )
    params = [scope_id, embedding_model, *fparams, HALF_MARGIN, scope_id, embedding_model,
              *fparams]  # fmt: skip
    if not rerank:
        return sql + "ev AS (SELECT id, 1.0 + hd AS d, o, false AS x FROM band), ", params
    sql += (
        f"ev AS MATERIALIZED (SELECT b.id, {_EXACT_D.format(id='b.id')} AS d, b.o, true AS x"
        f" FROM band b ORDER BY d, b.id LIMIT {int(pool)}), "
    )
    return sql, params


@dataclass
class FactFilter:
    categories: list[str] | None = None
    min_confidence: float | None = None

    def sql(self, alias: str = "") -> tuple[str, list[Any]]:
        parts: list[str] = []
        params: list[Any] = []
        if self.categories:
            parts.append(f"{alias}category = ANY(%s)")
            params.append(list(self.categories))
        if self.min_confidence is not None:
            parts.append(f"{alias}confidence >= %s")
            params.append(self.min_confidence)
        return "".join(f" AND {p}" for p in parts), params


def scope_vector_ranking(
    *,
    scope_id: int,
    vector: Sequence[float],
    embedding_model: str,
    limit: int,
    filter: FactFilter | None = None,
) -> list[tuple[uuid.UUID, float]]:
    """[(fact id, cosine similarity)] of the scope's facts, most similar first (exact)."""
    where, fparams = (filter or FactFilter()).sql()
    vwhere, vparams = (filter or FactFilter()).sql("v.")
    text = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    exact, exact_params = _exact_ctes(
        scope_id=scope_id, dims=len(vector), embedding_model=embedding_model, where=where,
        fparams=fparams, pool=limit,
    )  # fmt: skip
    sql = (
        f"WITH q AS MATERIALIZED (SELECT %s::vector AS qv), {exact[:-2]} "
        "SELECT id, d FROM ("
        " SELECT id, d FROM ev"
        " UNION ALL"
        f" SELECT v.id, v.embedding <=> (SELECT qv FROM q) FROM {_SHARED_JOIN}"
        f" AND v.dimensions = %s AND v.embedding_model = %s{vwhere}"
        ") ranked ORDER BY d, id LIMIT %s"
    )
    params = [text, *exact_params, scope_id, len(vector), embedding_model, *vparams, limit]
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [(row[0], 1.0 - float(row[1])) for row in cur.fetchall()]


@functools.cache
def _iterative_scan() -> bool:
    return pgvector_supports_iterative_scan(pgvector_version())


def scope_fact_count(*, scope_id: int) -> int:
    """Facts linked to the scope: its row's ``fact_count``, kept by the database on
    every link written (migration 0009)."""
    with connection.cursor() as cur:
        cur.execute("SELECT fact_count FROM memories_scope WHERE id = %s", [scope_id])
        row = cur.fetchone()
    return int(row[0]) if row else 0


def scope_is_large(*, scope_id: int, above: int) -> bool:
    """Whether the scope has more than ``above`` facts."""
    return scope_fact_count(scope_id=scope_id) > above


def scope_nearest_indexed(
    *, scope_id: int, vector: Sequence[float], embedding_model: str
) -> tuple[uuid.UUID, float] | None:
    """The scope's own fact nearest to ``vector`` through the HNSW index (see
    ``scope_vector_ranking_indexed``); None when the index finds nothing (the caller
    then scans exactly). A near duplicate is near: the approximation does not miss it."""
    ranked = scope_vector_ranking_indexed(
        scope_id=scope_id, vector=vector, embedding_model=embedding_model, limit=1
    )
    return ranked[0] if ranked else None


@functools.cache
def _index_type(dims: int) -> str | None:
    """``halfvec`` (migration 0007, pgvector >= 0.7), else ``vector`` (0006), or None."""
    return index_type("fact_hnsw", dims)


def _hnsw_settings(limit: int) -> list[tuple[str, object]]:
    """An HNSW walk's settings (``ef_search`` at least pgvector's default 40, at most its
    maximum 1000; the iterative scan walks on, in strict order, until the scope's
    ``limit`` rows are found or the scan cap)."""
    local: list[tuple[str, object]] = [("hnsw.ef_search", min(1000, max(40, limit)))]
    if _iterative_scan():
        local += [
            ("hnsw.iterative_scan", "strict_order"),
            ("hnsw.max_scan_tuples", hnsw.MAX_SCAN_TUPLES),
        ]
    return local


def scope_vector_ranking_indexed(
    *,
    scope_id: int,
    vector: Sequence[float],
    embedding_model: str,
    limit: int,
    filter: FactFilter | None = None,
) -> list[tuple[uuid.UUID, float]]:
    """``scope_vector_ranking`` for large scopes: the scope's own facts through the HNSW
    index of the dimension, filtered to the scope (pgvector's iterative scan, strict
    order, walks on until ``limit`` facts of the scope are found; approximate: the index
    ranks by its type, ``halfvec``, the distance handed back is the exact one), plus its
    shared facts ranked exactly (few). Fewer than ``limit`` rows only when the scope
    has fewer facts or the walk hit ``SEARCH_MAX_SCAN_TUPLES``: callers then rank
    exactly. Empty for a dimension without an index."""
    dims = len(vector)
    kind = _index_type(dims) if dims in INDEXED_DIMENSIONS else None
    if kind is None:
        return []
    where, fparams = (filter or FactFilter()).sql()
    vwhere, vparams = (filter or FactFilter()).sql("v.")
    text = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    sql = (
        "WITH q AS MATERIALIZED (SELECT %s::vector AS qv) "
        "SELECT id, d FROM ("
        f" (SELECT id, embedding::vector({dims}) <=> (SELECT qv FROM q) AS d"
        f" FROM memories_fact WHERE dimensions = {dims} AND scope_id = %s"
        f" AND embedding_model = %s{where}"
        f" ORDER BY embedding::{kind}({dims}) <=> (SELECT qv::{kind}({dims}) FROM q) LIMIT %s)"
        " UNION ALL"
        f" (SELECT v.id, v.embedding <=> (SELECT qv FROM q) FROM {_SHARED_JOIN}"
        f" AND v.dimensions = %s AND v.embedding_model = %s{vwhere})"
        ") ranked ORDER BY d, id LIMIT %s"
    )
    params = [text, scope_id, embedding_model, *fparams, limit,
              scope_id, dims, embedding_model, *vparams, limit]  # fmt: skip
    rows, _ = prepared.fetch(sql, params, prepare=False, local=_hnsw_settings(limit))
    return [(row[0], 1.0 - float(row[1])) for row in rows]


# --- The keyword leg: BM25 over the scope's facts --------------------------------------
# The query's lexemes (English stemming and stop words, as ``search_vector``) and their
# OR; ``{qv}``: the query vector's expression. Parameters: the scope's lexeme
# (``~scope:<id>``), then the text.
_QUERY = (
    "SELECT {qv} AS qv, coalesce((SELECT string_agg(quote_literal(l), ' | ') FROM unnest(x.ls)"
    " l), '')::tsquery AS words, x.ls AS lexemes, quote_literal(%s)::tsquery AS scope"
    " FROM (SELECT tsvector_to_array(to_tsvector('english'::regconfig, %s)) AS ls) x"
)


def _keyword_ctes(
    *, scope_id: int, pool: int, where: str, fparams: list[Any], vwhere: str, vparams: list[Any]
) -> tuple[str, list[Any]]:
    """CTEs (after ``q``: ``words``, ``lexemes``, ``scope``) ending in ``kw`` (id, r, o):
    the ``pool`` facts of the scope that hold a query lexeme and pass the filter
    (``where``, ``vwhere`` for the shared facts: " AND ..."), best first by their BM25
    score ``r`` (ties: newer ``o`` = ``observed_at`` first, then id)::

        r = sum over the query's lexemes t in the fact of
            idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
        idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))

    over the scope's facts (its own, ``scope_id``, and its shared ones), whatever the
    filter: N facts, ``df`` of them holding t, ``tf`` the occurrences of t in the fact,
    ``dl`` its length in distinct lexemes (``length(search_vector) - 1``: the scope's
    own lexeme is not text), ``avgdl`` the scope's mean; k1 and b are the knowledge
    side's (``SEARCH_BM25_K1``, ``SEARCH_BM25_B``). Unlike ``ts_rank``, a word few of
    the scope's facts hold (a name) weighs more than one most of them hold.

    Where the figures come from: every fact holding a query lexeme (``km``: one GIN
    lookup of the lexemes and the scope's ``~scope:<id>``) is read to be scored, so the
    document frequencies are counted from those rows (``kt``), exact and at no extra
    read; N and the total length are the scope row's ``text_facts`` and
    ``text_lexemes`` (migration 0010's triggers) plus its shared facts' (few, counted
    here): one row read, where a count of a 10,000-fact scope's lengths would read
    every one of its rows (BENCHMARKS.md, "Memory engine, fifth pass")."""
    k1, b = repr(bm25.K1), repr(bm25.B)
    sql = (
        "km AS MATERIALIZED (SELECT id, search_vector AS tv, observed_at AS o,"
        f" (true{where}) AS ok FROM memories_fact, q"
        " WHERE numnode(q.words) > 0 AND search_vector @@ (q.words && q.scope)"
        " UNION ALL"
        f" SELECT v.id, v.search_vector, v.observed_at, (true{vwhere}) FROM q, {_SHARED_JOIN}"
        " AND numnode(q.words) > 0 AND v.search_vector @@ q.words), "
        # (the query's lexemes among the fact's: ``search_vector`` holds weight D only)
        "kt AS MATERIALIZED (SELECT m.id, u.lexeme, coalesce(array_length(u.positions, 1), 1)"
        "::float8 AS tf FROM km m, q, unnest(ts_filter(setweight(m.tv, 'A', q.lexemes),"
        " '{a}')) u), "
        "ks AS MATERIALIZED (SELECT (e.n + s.n)::float8 AS n, greatest(e.l + s.l, 1)::float8"
        " / greatest(e.n + s.n, 1)::float8 AS avgdl FROM (SELECT coalesce(sum(text_facts), 0)"
        " AS n, coalesce(sum(text_lexemes), 0) AS l FROM memories_scope WHERE id = %s) e,"
        " (SELECT count(*) AS n, coalesce(sum(length(v.search_vector) - 1), 0) AS l"
        f" FROM {_SHARED_JOIN}) s WHERE EXISTS (SELECT 1 FROM km)), "
        "ki AS MATERIALIZED (SELECT t.lexeme, ln(1::float8 + (k.n - count(*) + 0.5::float8)"
        " / (count(*) + 0.5::float8)) AS idf FROM kt t, ks k GROUP BY t.lexeme, k.n), "
        f"kw AS MATERIALIZED (SELECT m.id, sum(i.idf * t.tf * ({k1}::float8 + 1::float8) / (t.tf"
        f" + {k1}::float8 * (1::float8 - {b}::float8 + {b}::float8 * (length(m.tv) - 1)"
        " / k.avgdl))) AS r, m.o FROM km m JOIN kt t ON t.id = m.id JOIN ki i"
        " ON i.lexeme = t.lexeme CROSS JOIN ks k WHERE m.ok GROUP BY m.id, m.o"
        f" ORDER BY r DESC, m.o DESC, m.id LIMIT {int(pool)}), "
    )
    return sql, [*fparams, *vparams, scope_id, scope_id, scope_id]


def scope_keyword_ranking(
    *,
    scope_id: int,
    text: str,
    limit: int,
    filter: FactFilter | None = None,
    embedding_model: str | None = None,
    dimensions: int | None = None,
) -> list[tuple[uuid.UUID, float]]:
    """[(fact id, BM25 score)] of the scope's facts holding a word of ``text``, best
    first (ties: newer first, then id), as the engine's search ranks its keyword leg
    (``_keyword_ctes``); ``embedding_model`` and ``dimensions``, when given, keep only
    the facts of that embedder (the statistics stay the scope's).

    Any query word matches (an OR of its English lexemes); the GIN lookup intersects
    them with the scope's own lexeme (``~scope:<id>``, see migration 0003), so it reads
    the scope's matches only, however many facts other scopes hold.
    """
    where, fparams = (filter or FactFilter()).sql()
    vwhere, vparams = (filter or FactFilter()).sql("v.")
    for column, value in (("embedding_model", embedding_model), ("dimensions", dimensions)):
        if value is not None:
            where, vwhere = f"{where} AND {column} = %s", f"{vwhere} AND v.{column} = %s"
            fparams, vparams = [*fparams, value], [*vparams, value]
    keyword, keyword_params = _keyword_ctes(
        scope_id=scope_id, pool=limit, where=where, fparams=fparams, vwhere=vwhere,
        vparams=vparams,
    )  # fmt: skip
    sql = (
        f"WITH q AS MATERIALIZED ({_QUERY.format(qv='NULL::vector')}), {keyword[:-2]} "
        "SELECT id, r FROM kw ORDER BY r DESC, o DESC, id"
    )
    rows, _ = prepared.fetch(sql, [f"~scope:{scope_id}", text, *keyword_params])
    return [(row[0], float(row[1])) for row in rows]


_HIT_COLUMNS = (
    "v.id, v.content, v.category, v.confidence, v.source_kind, v.source_ref, v.metadata, "
    "v.observed_at, "
    "v.created_at, v.updated_at"
)


@dataclass(frozen=True)
class Ranking:
    """How candidates are scored and which of them come back: ``weight`` x cosine
    similarity (negative counts as 0) + (1 - ``weight``) x the BM25 score over the best
    keyword candidate's (``_keyword_ctes``), times ``0.5 ** (age in days / half_life)``
    (the age from ``observed_at`` to ``now``, never negative; ``half_life`` 0: no
    decay), best first (equal scores: the newer ``observed_at`` first, then the id, so
    the order does not depend on the random ids); ``limit`` of them from ``offset``.
    The score as ``core.scoring.decay`` and the merge it replaces computed it, in the
    same order of float operations."""

    weight: float
    half_life: float
    now: datetime
    limit: int
    offset: int = 0


@dataclass(frozen=True)
class Statement:
    """A search statement: its SQL, parameters, and the ``set_config`` SELECT (with its
    parameters) to run before it in the same transaction, if any."""

    sql: str
    params: list[Any]
    settings: list[tuple[str, object]] | None = None


@dataclass(frozen=True)
class ScopeHits:
    """A search's hits: rows of ``_HIT_COLUMNS`` + (cosine similarity or None,
    BM25 score or None, score), best first; ``vector_path`` says how the vector leg
    ranked: "index" (HNSW walk), "exact" (a scan of the scope), "" (no vector leg)."""

    rows: list[tuple[Any, ...]]
    vector_path: str


def _scored(ranking: Ranking, pool: int) -> tuple[str, list[Any]]:
    """The CTEs and final SELECT over ``vec0`` (id, d, o, x: the vector candidates,
    ``x`` when ``d`` is exact, else within ``HALF_MARGIN`` / 2 of it) and ``kw``.

    The vector leg is the ``pool`` nearest of ``vec0`` by exact (d, id). Each candidate
    is in it for sure, out of it for sure, or, within the margin of the ``pool``-th
    distance, ambiguous (``m`` 1, 0, 2). A candidate's score lies between bounds
    (``lo``, ``hi``) from its distance's error and membership; one whose ``hi`` is
    below the (offset + limit)-th best ``lo`` cannot come back. The others (``cont``:
    the hits and the few within the margin of them) get their exact distance from
    their row (``exd``), and the ambiguous ones all do when one of them is a
    contender, to settle who is in the leg (``pin``). Then the contenders are scored
    exactly: the hits, their order and their figures are those of the exact ranking,
    for a few rows read instead of every candidate's."""
    e = HALF_MARGIN / 2
    decay = (
        "power(0.5::float8, greatest(0::float8, extract(epoch FROM (%s::timestamptz - o))"
        "::float8 / 86400) / %s::float8)"
        if ranking.half_life
        else "1::float8"
    )
    decay_params = [ranking.now, ranking.half_life] if ranking.half_life else []
    doubt = "EXISTS (SELECT 1 FROM cont WHERE m = 2)"
    sql = (
        f"pc AS MATERIALIZED (SELECT (SELECT d FROM vec0 ORDER BY d OFFSET {pool - 1} LIMIT 1)"
        f" AS t, CASE WHEN coalesce(bool_and(x), true) THEN 0 ELSE {e} END AS e FROM vec0), "
        "b AS MATERIALIZED (SELECT id, d, x, m, r, kn, dk, o, CASE WHEN m = 1 THEN"
        " (%s::float8 * greatest(1.0 - d - e, 0) + kn) * dk ELSE kn * dk END AS lo,"
        " CASE WHEN m = 0 THEN kn * dk ELSE (%s::float8 * greatest(1.0 - d + e, 0) + kn)"
        f" * dk END AS hi FROM (SELECT id, d, x, m, r, e, kn, o, {decay} AS dk FROM ("
        " SELECT coalesce(v.id, kw.id) AS id, v.d, coalesce(v.x, true) AS x,"
        " CASE WHEN v.id IS NULL THEN 0 WHEN p.t IS NULL THEN 1 WHEN v.d + v.e < p.t - p.e"
        " THEN 1 WHEN v.d - v.e > p.t + p.e THEN 0 ELSE 2 END AS m, kw.r, v.e,"
        " coalesce(v.o, kw.o) AS o, %s::float8 * coalesce(kw.r::float8, 0) / (SELECT"
        " coalesce(nullif(max(r), 0), 1)::float8 FROM kw) AS kn"
        f" FROM (SELECT id, d, o, x, CASE WHEN x THEN 0 ELSE {e} END AS e FROM vec0) v"
        " FULL JOIN kw ON kw.id = v.id CROSS JOIN pc p) z WHERE m <> 0 OR r IS NOT NULL) y), "
        "cont AS MATERIALIZED (SELECT * FROM b WHERE hi >= coalesce((SELECT lo FROM b"
        f" ORDER BY lo DESC OFFSET {ranking.offset + ranking.limit - 1} LIMIT 1), '-infinity')), "
        f"exd AS MATERIALIZED (SELECT b.id, {_EXACT_D.format(id='b.id')} AS d FROM b"
        f" WHERE NOT b.x AND b.m <> 0 AND (b.id IN (SELECT id FROM cont) OR (b.m = 2 AND {doubt}))), "
        "pin AS MATERIALIZED (SELECT a.id FROM (SELECT b.id, coalesce(exd.d, b.d) AS d"
        f" FROM b LEFT JOIN exd ON exd.id = b.id WHERE b.m = 2 AND {doubt}) a"
        f" ORDER BY a.d, a.id LIMIT greatest({pool} - (SELECT count(*) FROM b WHERE m = 1),"
        " 0)), "
        "c AS (SELECT t.id, CASE WHEN t.m = 1 OR t.id IN (SELECT id FROM pin)"
        " THEN 1.0 - coalesce(exd.d, t.d) END AS sim, t.r, t.kn, t.dk, t.o"
        " FROM cont t LEFT JOIN exd ON exd.id = t.id), "
        "s AS (SELECT c.id, c.sim, c.r, (%s::float8 * greatest(coalesce(c.sim, 0), 0)"
        " + c.kn) * c.dk AS score, c.o FROM c ORDER BY score DESC, o DESC, id"
        f" LIMIT {int(ranking.limit)} OFFSET {int(ranking.offset)}) "
        f"SELECT {_HIT_COLUMNS}, s.sim, s.r, s.score, (SELECT NOT yes FROM redo) "
        "FROM s JOIN memories_fact v ON v.id = s.id ORDER BY s.score DESC, s.o DESC, s.id"
    )
    w = ranking.weight
    params = [w, w, *decay_params, 1 - w, w]
    return sql, params


def candidates_statement(
    *,
    scope_id: int,
    text: str,
    vector: Sequence[float] | None,
    embedding_model: str | None,
    pool: int,
    index_above: int,
    ranking: Ranking,
    filter: FactFilter | None = None,
    walk_share: float = 0.0,
    exact_cap: int = 0,
) -> Statement:
    """A scope's whole search in one statement: both legs, the merge, the decay, and
    the rows of the hits that come back (``Ranking``).

    Keyword leg: the ``pool`` best facts by BM25 among those sharing a word with
    ``text``, with the scope's statistics (``_keyword_ctes``, as
    ``scope_keyword_ranking``). Vector leg (when ``vector`` is given): the ``pool`` most
    similar facts; a scope of more than ``index_above`` facts (its row's
    ``fact_count``) that also holds ``walk_share`` of the table's rows
    (``pg_class.reltuples``) or more than ``exact_cap`` facts is walked through the
    HNSW index of the dimension (``scope_vector_ranking_indexed``; a walk filtered to a
    scope visits about as many graph nodes as the scope is rare in the table, an exact
    ranking reads the scope's range of its 16-bit copies: the rarer scope is scanned,
    the larger share walked), and when that walk comes back short (a filter few facts
    pass, the scan cap) or the scope is small, the scope is ranked exactly
    (``_exact_ctes``, as ``scope_vector_ranking``): the branch not needed is gated off
    by the planner (a one-time filter), so it reads nothing. Candidates are scored from
    what the legs read (the copies hold ``observed_at``), so only the hits returned and
    the exact ranking's few candidates visit the table.
    The walk's settings (``Statement.settings``) run before it in the same round trip
    (``scope_fact_search``). The last column says whether the walk's answer was kept.
    ``pool``, the limit and the offset are written into the SQL (integers): with them
    as parameters PostgreSQL's generic plan guessed a tenth of the rows for each
    LIMIT, cost more than a custom plan for a small scope and lost to one, so every
    search of a small scope was planned anew (1.5-1.9 ms); known, the cached generic
    plan is chosen (a few texts: the pool follows the limit).
    """
    where, fparams = (filter or FactFilter()).sql()
    vwhere, vparams = (filter or FactFilter()).sql("v.")
    keyword, keyword_params = _keyword_ctes(
        scope_id=scope_id, pool=pool, where=where, fparams=fparams, vwhere=vwhere,
        vparams=vparams,
    )  # fmt: skip
    scored, scored_params = _scored(ranking, pool)
    if vector is None or embedding_model is None:
        sql = (
            f"WITH q AS MATERIALIZED ({_QUERY.format(qv='NULL::vector')}), {keyword}"
            "redo AS (SELECT true AS yes), "
            "vec0 AS (SELECT NULL::uuid AS id, NULL::float8 AS d, NULL::timestamptz AS o,"
            " true AS x WHERE false), "
            f"{scored}"
        )
        return Statement(sql, [f"~scope:{scope_id}", text, *keyword_params, *scored_params])
    dims = len(vector)
    kind = _index_type(dims) if dims in INDEXED_DIMENSIONS else None
    literal = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    walk, walk_params = "", []
    if kind is not None:
        walk = (
            "lim AS MATERIALIZED (SELECT greatest(%s::float8, least(%s::float8, (SELECT "
            "reltuples FROM pg_class WHERE oid = 'memories_fact'::regclass) * %s::float8))"
            "::int8 AS n), "
            "big AS MATERIALIZED (SELECT coalesce((SELECT fact_count > (SELECT n FROM lim)"
            " FROM memories_scope WHERE id = %s), false) AS yes), "
            "iv AS MATERIALIZED ("
            f"SELECT id, embedding::vector({dims}) <=> (SELECT qv FROM q) AS d, observed_at AS o"
            f" FROM memories_fact WHERE dimensions = {dims} AND scope_id = %s"
            f" AND embedding_model = %s{where} AND (SELECT yes FROM big)"
            f" ORDER BY embedding::{kind}({dims}) <=> (SELECT qv::{kind}({dims}) FROM q)"
            f" LIMIT {int(pool)}), "
        )
        walk_params = [index_above, max(exact_cap, index_above), walk_share, scope_id,
                       scope_id, embedding_model, *fparams]  # fmt: skip
        redo = (
            "redo AS MATERIALIZED (SELECT NOT (SELECT yes FROM big) OR "
            f"(SELECT count(*) FROM iv) + (SELECT count(*) FROM sv) < {int(pool)} AS yes), "
        )
        redo_params: list[Any] = []
        walked = "SELECT id, d, o, true AS x FROM iv WHERE NOT (SELECT yes FROM redo) UNION ALL "
    else:
        redo, redo_params, walked = "redo AS (SELECT true AS yes), ", [], ""
    exact, exact_params = _exact_ctes(
        scope_id=scope_id, dims=dims, embedding_model=embedding_model, where=where,
        fparams=fparams, pool=pool, gate="(SELECT yes FROM redo)", rerank=False,
    )  # fmt: skip
    sql = (
        f"WITH q AS MATERIALIZED ({_QUERY.format(qv='%s::vector')}), "
        f"{walk}"
        "sv AS MATERIALIZED (SELECT v.id, v.embedding <=> (SELECT qv FROM q) AS d,"
        f" v.observed_at AS o FROM {_SHARED_JOIN} AND v.dimensions = %s"
        f" AND v.embedding_model = %s{vwhere}), "
        f"{redo}"
        f"{exact}"
        f"vec0 AS MATERIALIZED ({walked}SELECT id, d, o, x FROM ev"
        " UNION ALL SELECT id, d, o, true FROM sv), "
        f"{keyword}"
        f"{scored}"
    )
    params = [literal, f"~scope:{scope_id}", text, *walk_params,
              scope_id, dims, embedding_model, *vparams, *redo_params,
              *exact_params, *keyword_params, *scored_params]  # fmt: skip
    return Statement(sql, params, None if kind is None else _hnsw_settings(pool))


def scope_fact_search(
    *,
    scope_id: int,
    text: str,
    vector: Sequence[float] | None,
    embedding_model: str | None,
    pool: int,
    index_above: int,
    ranking: Ranking,
    filter: FactFilter | None = None,
    walk_share: float = 0.0,
    exact_cap: int = 0,
) -> ScopeHits:
    """A scope's search (``candidates_statement``), one round trip, prepared.

    Outside a transaction it runs on its generic plan with sequential scans off, both
    local to its own (implicit) transaction: every table it reads is read through an
    index by design, and a plan made without the scope's size could otherwise scan the
    copies of a scope holding much of the table (a few scopes, one large) for every
    scope; planning it per search cost 1.5-4 ms (BENCHMARKS.md, "Memory engine, fourth
    pass"). Inside a caller's transaction the settings would outlast the statement: it
    is planned as usual there (as ``knowledge.search`` does)."""
    statement = candidates_statement(
        scope_id=scope_id, text=text, vector=vector, embedding_model=embedding_model, pool=pool,
        index_above=index_above, ranking=ranking, filter=filter, walk_share=walk_share,
        exact_cap=exact_cap,
    )  # fmt: skip
    local = list(statement.settings or [])
    if not connection.in_atomic_block:
        local += [("plan_cache_mode", "force_generic_plan"), ("enable_seqscan", "off")]
    rows, _ = prepared.fetch(statement.sql, statement.params, local=local)
    path = "" if vector is None else "index" if rows and rows[0][-1] else "exact"
    if vector is not None and not rows:  # (no row to carry the flag: ask the scope)
        path = "index" if scope_is_large(scope_id=scope_id, above=index_above) else "exact"
    return ScopeHits([row[:-1] for row in rows], path)
