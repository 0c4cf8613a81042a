"""One retrieval engine for every table of embedded text.

A *collection* (``Collection``) says which table holds the text and its vectors and how
its rows are ranked where users may choose (fusion, weights, context, decay); the
engine writes every statement that ranks. A search is two *legs*, each a statement
giving (id, value) best first: the vector leg (``vectors.vector_leg``: cosine distance)
and the keyword leg (``bm25``: BM25 score); then one statement fuses them, adds context,
decays, cuts to the page wanted and reads the hits' rows (``_fuse_sql``).

The legs run inside that statement (one round trip), or, for a large scope outside a
transaction, each on its own connection at once, their rows then handed to the same
fusing statement as arrays: the same SQL over the same rows, so the same ranking to the
bit, in the longer leg's time instead of both.

Fusion (``Collection.fusion``):
- ``minmax``: each leg's scores scaled to [0, 1] over its best ``SCALED`` rows (its best
  1, the worst of those 0, and lower; 1 when they are all equal: a longer page, whose
  legs hand over more, scales its first rows the same), added with weights w and 1 - w;
  a row missing from a leg gets 0 from it. Unlike reciprocal ranks it keeps how far
  apart the scores are: a row with a BM25 score far above the rest (a rare name) stays
  far ahead.
- ``max``: w x cosine similarity (negative counts as 0) + (1 - w) x the BM25 score over the
  best keyword candidate's. A keyword candidate the vector leg did not hand over counts
  its own similarity, its vector read by its key (``Collection.complete``), not 0: the
  row scores the same whatever the vector leg's pool (a store of LoCoMo turns: R@5
  0.514 -> 0.581 and 0.600 -> 0.635; BENCHMARKS.md, "The stores' 15 ms: copies stored
  plain, text vectors in line, one walk").
- ``rrf`` (asked per search): the sum over the legs of 1 / (k + rank).
A search with one leg scores by that leg's raw value (similarity or BM25).

Context (``Context``, chunks): a candidate among the best ``donors`` lends w ** d x its
score to the rows d steps before and after it (d up to ``window``) along its *lane*: the
first of the context's lanes whose condition it meets says which rows are its group and
their order (chunks: a session's turns in time order, or a session-less chunk's own
document in chunk order; separate documents lend nothing). Those rows become candidates
themselves. A row's own score s and what it borrows combine as s + (1 - s) x lent, lent =
1 - prod(1 - w ** d x donor) over the best donor at each distance: in [0, 1] when the
scores are, never lower than s. In a conversation the words of a question are often in
one turn and the answer in the next.

Decay (a half-life in days): a candidate's own score x ``0.5 ** (age / half_life)``, the
age from the collection's ``time`` to now, never negative (``core.scoring.decay``, same
float operations), before context: a row lends its decayed score.

Lifts (``_lift_sql``): a candidate a cue of the query points at (a period it names, the
row's ``event_time`` in it: ``dates.Dated``; another cue, ``Lift``, by the condition the
collection gives it: chunks have the speaker a query names and turns that tell a time)
has its own score s lifted to s + (1 - s) x w, after decay and before context, w the
cues' lifts combined as 1 - prod(1 - lift): fused scores only.

A similarity threshold (``Ranking.max_distance``) drops the vector candidates past it and
every row that is no candidate of a leg: each hit then matches a leg itself.
Ties: the collection's ``tiebreak``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from knowledge.retrieval.dates import Dated
from knowledge.retrieval.db import Setting, Statement, at_once, fetch, fetch_all

# Rows each leg hands to fusion, at least (3 x the page wanted when that is more).
CANDIDATES = 50
# Min-max fusion scales each leg over its best this many rows (every row it hands over,
# for a page of up to 20 of a search that hands over max(3 x the page, this)): a longer
# page, whose legs hand over more, scores its first rows the same.
SCALED = 60


@dataclass(frozen=True)
class Lane:
    """Where a donor's neighbours are: for a donor whose row meets ``when`` (a condition
    on row ``c``), the rows of its group (``group``: columns equal to the donor's), in
    ``order`` (columns, the last one unique)."""

    when: str
    group: tuple[str, ...]
    order: tuple[str, ...]


@dataclass(frozen=True)
class Context:
    """Neighbours pass their score on (see the module), along the first of ``lanes`` whose
    condition the donor meets (none: it passes nothing)."""

    lanes: tuple[Lane, ...]
    weight: float = 0.6
    window: int = 2
    # The best this many candidates lend, however long the page: a page's first rows do
    # not depend on how many rows it asks for (nor does the legs' scaling, ``SCALED``).
    donors: int = 20


@dataclass(frozen=True)
class Collection:
    """A table of embedded text, as the engine ranks it (no SQL that ranks: names only).

    ``exact_max``, ``walk_min_share``, ``exact_cap``: which scopes the vector leg scans
    exactly (``vectors``). ``pending``: a boolean column marking rows the background
    indexer has not put in the HNSW index yet. ``time``: the column a row's age is
    counted from (every leg carries it, as ``o``). ``details``: what is read of each hit
    (columns of ``t``).
    """

    name: str
    table: str
    index_prefix: str
    id_type: str
    details: str
    time: str  # a row's time, its age counted from it (its columns, in its copies too)
    tiebreak: str  # after the score, over ``{top}``'s ranks, time (o) and id
    fusion: str = "minmax"
    vector_weight: float = 0.4
    context: Context | None = None
    embedding: str = "embedding"
    dims_column: str = "dimensions"
    pending: str = ""
    # A table of 16-bit unit copies of the vectors with the scope's columns, in scope
    # order, for exact scans of up to ``copies_max_dims`` dimensions (``vectors._exact``).
    copies: str = ""
    copies_max_dims: int = 1024
    exact_max: int = 10_000
    walk_min_share: float = 0.0
    exact_cap: int = 10**12
    # A walk's ``hnsw.ef_search`` up to ``hnsw.EF_SCALE_ROWS`` rows (0: ``hnsw.EF_SEARCH``;
    # beyond, every collection's grows from ``EF_SEARCH``), at least twice the rows it wants.
    ef_search: int = 0
    # ``max`` fusion: a keyword candidate the vector leg did not hand over gets its own
    # cosine similarity (its vector read by its key), not 0 (see the module).
    complete: bool = True
    # The time a row's text was said or written, when it has one (a chat turn's): what
    # a date the query names is matched against (``Dated``). "": no row has one.
    event_time: str = ""
    # Conditions a query's cue (``Lift``) names by key: each a condition on a row's
    # columns, its %s the lift's parameters (a chat turn's speaker, a turn telling a time).
    cues: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Scope:
    """Which rows a search ranks: a condition on the collection's rows (``sql`` with
    ``params``), and how many rows it holds when that is known without counting
    (``rows``), or a statement reading that count (``size``: a counter on a row)."""

    sql: str
    params: list[Any]
    rows: int | None = None
    size: tuple[str, list[Any]] | None = None
    # Rows of the scope outside ``sql``'s range (a fact shared with it: few), always
    # ranked exactly: a condition on the collection's rows.
    extra: tuple[str, list[Any]] | None = None
    # Whether ``sql`` names only columns the collection's copies hold (an exact ranking
    # may read them instead of the table).
    in_copies: bool = True


@dataclass
class Leg:
    """A statement giving rows best first, the settings it needs, and how its vector leg
    ran ("exact", "index", "filtered"; "" for a keyword leg). Rows: (id, distance,
    walked, time) of a vector leg, (id, score, time) of a keyword leg."""

    sql: str
    params: list[Any]
    local: list[Setting]
    path: str = ""
    prepare: bool = True
    rows: list[tuple[Any, ...]] | None = None  # its rows, once run apart
    # A leg computed in Python (statements of its own, e.g. the pruned BM25 leg): called
    # by ``run``, so a split search runs it beside the other leg rather than before it.
    produce: Callable[[], list[tuple[Any, ...]]] | None = None
    # A vector leg's query (VectorParam) and dimensions: what the fusion measures a
    # keyword candidate against when the leg did not find it (``Collection.complete``).
    query: Any = None
    dims: int = 0
    within: tuple[str, list[Any]] = ("true", [])  # (the rows it ranks, as a condition)

    def run(self) -> list[tuple[Any, ...]]:
        if self.rows is None and self.produce is not None:
            self.rows = self.produce()
        elif self.rows is None:
            self.rows = fetch(self.sql, self.params, self.prepare, with_pinned(self.local))[0]
        return self.rows


@dataclass(frozen=True)
class Lift:
    """A cue of the query (``Collection.cues`` key ``cue``, with ``params``): the rows
    meeting its condition are lifted by ``lift`` (see the module)."""

    cue: str
    params: tuple[Any, ...]
    lift: float


@dataclass(frozen=True)
class Ranking:
    """How a search ranks (beside its collection's defaults) and which page comes back.
    ``max_distance``: vector candidates farther than this are dropped. ``neighbours``:
    the condition a context neighbour that is no candidate must meet (row ``t``)."""

    limit: int
    offset: int = 0
    rrf_k: int | None = None
    max_distance: float | None = None
    half_life: float | None = None
    now: datetime | None = None
    context: bool = True
    neighbours: tuple[str, list[Any]] = ("true", [])
    vector_weight: float | None = None
    vector_required: bool = False  # only rows with a similarity (within max_distance)
    # Lifts (fused scores only: not with rrf_k or one leg; see the module): the periods
    # a query names, and its other cues.
    dated: Dated | None = None
    lifts: tuple[Lift, ...] = ()


def _pinned() -> list[Setting]:
    """The plan policy of every search statement: outside a transaction, its generic plan
    with sequential scans off and no parallel workers, all local to its own (implicit)
    transaction. Every table is read through an index by design, and a plan made without
    the scope's size could otherwise scan a whole table for a small scope; planning each
    search anew cost more than running it on a small scope (1.2-4 ms). The generic plan
    guesses a scope's rows without its values (45,000 for a base of 4,500 chunks among a
    million) and then ranked them exactly on parallel workers, whose start cost 5-8 ms of
    a 10 ms search. Inside a caller's transaction the settings would outlast the
    statement: there it is planned as usual."""
    if connection.in_atomic_block:
        return []
    return [
        ("plan_cache_mode", "force_generic_plan"),
        ("enable_seqscan", "off"),
        ("max_parallel_workers_per_gather", 0),
    ]


def with_pinned(local: list[Setting]) -> list[Setting]:
    """``local`` and the plan policy's settings it does not name already (a walk asks for
    no parallel workers itself, inside a transaction too: sent once)."""
    named = {name for name, _ in local}
    return local + [s for s in _pinned() if s[0] not in named]


def _given(
    c: Collection, value: str, rows: list[tuple[Any, ...]], at: int | None
) -> tuple[str, list[Any]]:
    """A leg's rows as the statement's arrays (literals: psycopg's list adapter cost
    0.17 ms for four of them; a float's repr reads back as the same float8); ``at``: the
    column of a row's time, when the rows have it and a decay reads it (None: every
    time NULL, which ``unnest`` pads an empty array with)."""
    ids = "{" + ",".join(str(r[0]) for r in rows) + "}"
    values = "{" + ",".join(repr(float(r[1])) for r in rows) + "}"
    times = "{}" if at is None else "{" + ",".join(
        f'"{r[at].isoformat()}"' if len(r) > at and r[at] is not None else "NULL" for r in rows
    ) + "}"  # fmt: skip
    sql = (
        f"SELECT * FROM unnest(%s::{c.id_type}[], %s::float8[], %s::timestamptz[])"
        f" AS g(id, {value}, o)"
    )
    return sql, [ids, values, times]


def _leg_sql(c: Collection, leg: Leg | None, value: str, at: int | None) -> tuple[str, list[Any]]:
    if leg is None:
        return (
            f"SELECT NULL::{c.id_type} AS id, NULL::float8 AS {value},"
            " NULL::timestamptz AS o WHERE false",
            [],
        )
    if leg.rows is not None or leg.produce is not None:
        return _given(c, value, leg.run(), at)
    return leg.sql, leg.params


def _fusion(c: Collection, r: Ranking, one_leg: bool, filled: bool) -> tuple[str, list[Any]]:
    if one_leg:
        return "coalesce(vr.s, kr.s)", []
    if r.rrf_k is not None:
        k = float(r.rrf_k)
        return (
            "coalesce(1.0::float8 / (%s::float8 + vr.rank), 0)"
            " + coalesce(1.0::float8 / (%s::float8 + kr.rank), 0)",
            [k, k],
        )
    w = float(c.vector_weight if r.vector_weight is None else r.vector_weight)
    if c.fusion == "max":
        return (
            f"%s::float8 * greatest(coalesce(vr.s,{' fl.s,' if filled else ''} 0), 0)"
            " + %s::float8 * coalesce(kr.s, 0)"
            " / coalesce(nullif(kx.hi, 0), 1)::float8",
            [w, 1.0 - w],
        )
    scaled = (  # (a row below the leg's best SCALED, its lo, counts 0: as if missing)
        "CASE WHEN {x}r.id IS NULL THEN 0 WHEN {x}x.hi > {x}x.lo"
        " THEN greatest(({x}r.s - {x}x.lo) / ({x}x.hi - {x}x.lo), 0) ELSE 1 END"
    )
    return (
        f"%s::float8 * {scaled.format(x='v')} + %s::float8 * {scaled.format(x='k')}",
        [w, 1.0 - w],
    )


_CONTEXT = """donor AS MATERIALIZED (SELECT id, score FROM cand ORDER BY score DESC, id LIMIT {donors}),
nb AS MATERIALIZED (
    SELECT d.score, {before} AS before, {after} AS after
    FROM donor d JOIN {table} c ON c.id = d.id
),
best AS (
    SELECT u.id, u.dist, max(nb.score) AS score
    FROM nb CROSS JOIN LATERAL (
        SELECT * FROM unnest(nb.before) WITH ORDINALITY AS b(id, dist)
        UNION ALL
        SELECT * FROM unnest(nb.after) WITH ORDINALITY AS a(id, dist)
    ) u
    GROUP BY u.id, u.dist
),
bonus AS (
    SELECT id, 1 - exp(sum(ln(greatest(1 - power(%s::float8, dist) * score, 1e-300)))) AS bonus
    FROM best GROUP BY id
),
ranked AS (
    SELECT coalesce(c.id, x.id) AS id,
           coalesce(c.score, 0) + (1 - coalesce(c.score, 0)) * coalesce(x.bonus, 0) AS score,
           c.vrank, c.krank, c.vscore, c.kscore, c.o, c.id IS NOT NULL AS candidate
    FROM cand c FULL JOIN bonus x ON x.id = c.id
)"""


def _lane_sql(table: str, lanes: tuple[Lane, ...], after: bool, window: int) -> str:
    """The ids of a donor's ``window`` neighbours before (or after) it, in its lane."""
    whens = []
    for lane in lanes:
        order = ", ".join(f"n.{col}" for col in lane.order)
        mine = ", ".join(f"c.{col}" for col in lane.order)
        same = " AND ".join(f"n.{col} = c.{col}" for col in lane.group)
        direction = "" if after else " DESC"
        ordered = ", ".join(f"n.{col}{direction}" for col in lane.order)
        whens.append(
            f"WHEN {lane.when} THEN ARRAY(SELECT n.id FROM {table} n WHERE {same}"
            f" AND ({order}) {'>' if after else '<'} ({mine}) ORDER BY {ordered} LIMIT {window})"
        )
    return "CASE " + " ".join(whens) + " END"


def _context_sql(c: Collection, ctx: Context) -> tuple[str, list[Any]]:
    sql = _CONTEXT.format(
        donors=ctx.donors, table=c.table,
        before=_lane_sql(c.table, ctx.lanes, False, ctx.window),
        after=_lane_sql(c.table, ctx.lanes, True, ctx.window),
    )  # fmt: skip
    return sql, [float(ctx.weight)]


def _fill_sql(
    c: Collection, vector: Leg | None, keyword: Leg | None, r: Ranking
) -> tuple[str, list[Any]] | None:
    """CTE ``fl``: (id, s) of the keyword candidates the vector leg did not hand over
    and could have (rows of its dimension and scope: ``Leg.within``), ``s`` their
    cosine similarity to the query (within ``max_distance`` when it is set), for ``max``
    fusion with ``Collection.complete``; None otherwise."""
    if (
        not c.complete or c.fusion != "max" or r.rrf_k is not None
        or vector is None or keyword is None or vector.query is None
    ):  # fmt: skip
        return None
    near, near_params = "", []
    if r.max_distance is not None:
        near, near_params = " AND x.d <= %s", [r.max_distance]
    within, within_params = vector.within
    sql = (
        f"SELECT x.id, 1.0::float8 - x.d AS s FROM (SELECT k.id, (SELECT t.{c.embedding}"
        f" <=> %s::vector FROM {c.table} t WHERE t.id = k.id AND t.{c.dims_column} ="
        f" {int(vector.dims)} AND ({within})) AS d FROM k"
        f" WHERE NOT EXISTS (SELECT 1 FROM v WHERE v.id = k.id)) x WHERE x.d IS NOT NULL{near}"
    )
    return sql, [vector.query, *within_params, *near_params]


def _lift_sql(c: Collection, r: Ranking, one_leg: bool) -> tuple[str, list[Any]] | None:
    """CTE ``ev``: (id, w) of the candidates a cue of the query lifts, w their lift: each
    ``Lift`` whose cue the collection has (a row meeting its condition gets its lift) and
    the periods it names (``Dated``: a row whose ``event_time``, in UTC, falls in one or up
    to ``grace`` days after it gets its ``lift``), combined as 1 - prod(1 - lift), 0 for a
    candidate no cue points at. None when nothing is lifted (no cue the collection has, or
    scores that are no fusion's: rrf, or one leg's raw values). The candidates' rows are
    read once, by id, each cue's condition tested once, and each one's date
    tested with scalar operations: a range test for a period with its year; month (and
    day) numbers of the date and of the date ``grace`` days before for one without (a
    window shorter than a month holds a named day or month iff one of its ends is in it
    or, for a day, the day lies between them)."""
    if one_leg or r.rrf_k is not None:
        return None
    d = r.dated if r.dated is not None and r.dated.periods and c.event_time else None
    cues = dict(c.cues)
    named = [x for x in r.lifts if x.cue in cues and x.lift]
    if d is None and not named:
        return None
    lifts: list[str] = []  # (each a CASE giving its lift or 0)
    params: list[Any] = []
    for x in named:
        lifts.append(f"CASE WHEN {cues[x.cue]} THEN %s::float8 ELSE 0 END")
        params += [*x.params, float(x.lift)]
    day = ""
    if d is not None:
        tests, test_params = _period_tests(d)
        lifts.append(f"CASE WHEN {tests} THEN %s::float8 ELSE 0 END")
        params += [*test_params, float(d.lift)]
        day = f" CROSS JOIN LATERAL (SELECT ({c.event_time} AT TIME ZONE 'UTC')::date AS d) e"
    w = lifts[0] if len(lifts) == 1 else "1 - " + " * ".join(f"(1 - {x})" for x in lifts)
    sql = (
        f"SELECT a.id, {w} AS w FROM {c.table} a{day}"
        " WHERE a.id IN (SELECT id FROM v UNION SELECT id FROM k)"
    )
    return sql, params


def _period_tests(d: Dated) -> tuple[str, list[Any]]:
    """Whether a row's date ``e.d`` falls in one of ``d``'s periods or the ``grace`` days
    after it (see ``_lift_sql``), as one condition and its parameters."""
    ranges, months, days = d.windows()
    tests: list[str] = []
    params: list[Any] = []
    if ranges:
        tests.append("e.d <@ %s::datemultirange")
        params.append(ranges)
    grace = int(d.grace)  # (a constant: the statement's text varies with the count only)
    for month in months:
        tests.append(f"extract(month FROM e.d) = %s OR extract(month FROM e.d - {grace}) = %s")
        params += [int(month), int(month)]
    key = "(extract(month FROM {x}) * 100 + extract(day FROM {x}))"
    last, first = key.format(x="e.d"), key.format(x=f"(e.d - {grace})")
    for month, day in days:
        md = int(month) * 100 + int(day)
        tests.append(
            f"CASE WHEN {first} <= {last} THEN %s BETWEEN {first} AND {last}"
            f" ELSE %s >= {first} OR %s <= {last} END"
        )
        params += [md, md, md]
    return "(" + " OR ".join(f"({t})" for t in tests) + ")", params


def _fuse_sql(
    c: Collection, vector: Leg | None, keyword: Leg | None, r: Ranking
) -> tuple[str, list[Any]]:
    """The statement fusing the legs (inline, or their rows as arrays), with context and
    decay, giving the page wanted with its rows' details, best first."""
    decayed = bool(r.half_life)  # (the rows' times matter only to a decay)
    vsql, vparams = _leg_sql(c, vector, "d", 3 if decayed else None)
    ksql, kparams = _leg_sql(c, keyword, "score", 2 if decayed else None)
    cut, cut_params = "", []
    if r.max_distance is not None:
        cut, cut_params = " WHERE d <= %s", [r.max_distance]
    fill = _fill_sql(c, vector, keyword, r)
    fusion, fusion_params = _fusion(c, r, vector is None or keyword is None, fill is not None)
    decay, decay_params = "", []
    if r.half_life:
        # A row's own score decays with its age, before context: what a row lends is
        # its decayed score. The age from the time the legs carry (read for a row whose
        # leg had none). PostgreSQL raises on a power that underflows to 0, Python gives 0.
        time = (
            f"coalesce(vr.o, kr.o, (SELECT {c.time} FROM {c.table} a"
            " WHERE a.id = coalesce(vr.id, kr.id)))"
        )
        halvings = (
            f"greatest(0::float8, extract(epoch FROM (%s::timestamptz - {time}))::float8"
            " / 86400) / %s::float8"
        )
        decay = (
            " * (SELECT CASE WHEN h < 1074 THEN power(0.5::float8, h) ELSE 0 END"
            f" FROM (SELECT {halvings} AS h) x)"
        )
        decay_params = [r.now, float(r.half_life)]
    own, lift_ctes, lift_params, lifted = f"({fusion}){decay}", [], [], ""
    lift = _lift_sql(c, r, vector is None or keyword is None)
    if lift is not None:  # (cues of the query: the candidates they name, lifted)
        own = f"(SELECT z.s + (1 - z.s) * coalesce(ev.w, 0) FROM (SELECT {own} AS s) z)"
        lift_ctes, lift_params = [f"ev AS MATERIALIZED ({lift[0]})"], lift[1]
        lifted = " LEFT JOIN ev ON ev.id = coalesce(vr.id, kr.id)"
    vscore, join, fill_ctes, fill_params = "vr.s", "", [], []
    if fill is not None:  # (keyword candidates the vector leg did not hand over, measured)
        vscore, join = "coalesce(vr.s, fl.s)", " LEFT JOIN fl ON fl.id = kr.id AND vr.id IS NULL"
        fill_ctes, fill_params = [f"fl AS MATERIALIZED ({fill[0]})"], fill[1]
    ctes = [
        f"v AS MATERIALIZED ({vsql})",
        f"k AS MATERIALIZED ({ksql})",
        "vr AS (SELECT id, 1.0::float8 - d AS s, o, (row_number() OVER (ORDER BY d, id))::int"
        f" AS rank FROM v{cut})",
        "kr AS (SELECT id, score AS s, o, (row_number() OVER (ORDER BY score DESC, id))::int"
        " AS rank FROM k)",
        *fill_ctes,
        *lift_ctes,
        f"cand AS (SELECT coalesce(vr.id, kr.id) AS id, {own} AS score,"
        f" vr.rank AS vrank, kr.rank AS krank, {vscore} AS vscore, kr.s AS kscore,"
        f" coalesce(vr.o, kr.o) AS o FROM vr FULL JOIN kr ON kr.id = vr.id{join}{lifted}"
        f" CROSS JOIN (SELECT max(s) AS hi, min(s) FILTER (WHERE rank <= {SCALED}) AS lo"
        " FROM vr) vx"
        f" CROSS JOIN (SELECT max(s) AS hi, min(s) FILTER (WHERE rank <= {SCALED}) AS lo"
        " FROM kr) kx)",
    ]
    params = [
        *vparams, *kparams, *cut_params, *fill_params, *lift_params, *fusion_params,
        *decay_params,
    ]  # fmt: skip
    context = c.context if r.context and vector is not None and keyword is not None else None
    if context is not None:
        sql, context_params = _context_sql(c, context)
        ctes.append(sql)
        params += context_params
        keep, keep_params = r.neighbours
    else:
        ctes.append("ranked AS (SELECT *, true AS candidate FROM cand)")
        keep, keep_params = "true", []
    # A row that only borrowed context is a hit when it meets the search's filters
    # (``keep``) and no similarity threshold was asked: under a threshold, every hit is
    # a candidate of a leg itself (a keyword match, or a vector within ``max_distance``).
    if r.max_distance is not None:
        keep, keep_params = "false", []
    # The rows are read here only to check a neighbour against the search's filters.
    join = f" JOIN {c.table} t ON t.id = r.id" if keep not in ("true", "false") else ""
    where = f"(r.candidate OR {keep})" + (" AND r.vscore IS NOT NULL" if r.vector_required else "")
    ctes.append(
        f"top AS (SELECT r.id, r.score, r.vrank, r.krank, r.vscore, r.kscore, r.o"
        f" FROM ranked r{join} WHERE {where}"
        f" ORDER BY 2 DESC, {c.tiebreak.format(top='r')} LIMIT {int(r.limit)}"
        f" OFFSET {int(r.offset)})"
    )
    params += keep_params
    sql = (
        f"/* {c.name} search */WITH "
        + ",\n".join(ctes)
        + f"\nSELECT {c.details}, top.score, top.vrank, top.krank,"
        f" top.vscore, top.kscore FROM top JOIN {c.table} t ON t.id = top.id"
        f" ORDER BY top.score DESC, {c.tiebreak.format(top='top')}"
    )
    return sql, params


def statement(c: Collection, vector: Leg | None, keyword: Leg | None, r: Ranking) -> Statement:
    """The search as one statement (its legs inline, or their rows once run apart)."""
    sql, params = _fuse_sql(c, vector, keyword, r)
    inline = [leg for leg in (vector, keyword) if leg is not None and leg.rows is None]
    local = [s for leg in inline for s in leg.local]
    return Statement(sql, params, all(leg.prepare for leg in inline), with_pinned(local))


def rows_of(result: tuple[list[tuple[Any, ...]], list[str]]) -> list[dict[str, Any]]:
    rows, names = result
    return [dict(zip(names, row)) for row in rows]


def rank(
    c: Collection, vector: Leg | None, keyword: Leg | None, r: Ranking, split: bool = False
) -> list[dict[str, Any]]:
    """The page of hits ``r`` asks for, best first: dicts of the collection's ``details``
    plus score, vrank, krank, vscore, kscore. ``split``: run the legs on two connections
    at once first (outside a transaction), then fuse their rows."""
    if split and vector is not None and keyword is not None and not connection.in_atomic_block:
        at_once([vector.run, keyword.run])
    return rows_of(fetch_all([statement(c, vector, keyword, r)])[0])
