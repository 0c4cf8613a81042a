"""BM25 ranking of chunks in plain PostgreSQL, with top-k pruning.

The lexemes come from ``search_vector`` (the base's text-search configuration: its
stemming and stop words), the statistics from ``knowledge_term_stats`` and
``knowledge_base_text_stats``, which triggers keep exact in every chunk write's
transaction (migration 0009). A chunk's score is the sum, over the query's lexemes it
holds, of

    idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))

with N the chunks of the searched bases, df those holding t, tf the occurrences of t in
the chunk and dl its length in distinct lexemes (``length(search_vector)``; avgdl its
mean over the bases). Unlike ``ts_rank``, a word that is rare in the base (a name, "LGBTQ")
weighs more than one every chunk has.

Two passes: the matching chunks are ranked by the score with every tf taken as 1 (one
index lookup per query term and row, about what ``ts_rank`` costs; short chunks rarely
repeat a word), and only the best EXACT_FACTOR x ``limit`` of them are scored with their
term frequencies.

Pruning (MaxScore over the GIN index). Ranking every match is what costs at a million
chunks: a query of common words matches tens of thousands of chunks, each read from the
table. But with tf 1 a term adds at most ``ub(t) = idf(t) * (k1 + 1) / (1 + k1 * (1 - b))``
to a chunk (dl >= 0), so a chunk whose first-pass score reaches theta holds a set of
query terms whose bounds add up to theta. Given theta, the statement reads only the
chunks matching the OR of those minimal sets, ``(a & b) | (a & c) | d``, which the GIN
index answers from its posting lists. If the chunks wanted all reach theta, they are the
ones the unpruned ranking would pick: any chunk left out ranks below theta. Theta is
guessed from the terms' document frequencies (the first-pass score above which about
PRUNE_MARGIN x the chunks wanted are expected, terms taken as independent); when the
guess was too high, a second statement takes the last first-pass score found as theta
and reads what the first one did not. Either way the result is what ranking every match
gives.
"""

from __future__ import annotations

import math
import re
from typing import Any

from knowledge.retrieval.db import fetch
from knowledge.retrieval.engine import Leg, Scope

# Term-frequency saturation and length normalisation (b 0.3 beat 0.5/0.75/0.9 on LoCoMo
# conv-26: short turns, BENCHMARKS.md).
K1 = 1.2
B = 0.3

# The query's lexemes held by chunks of the searched bases, each with its document
# frequency there, and the bases' size and mean length.
_TERMS_SQL = """
SELECT q.lexeme, sum(s.df)::float8, tot.n, tot.avgdl
FROM (SELECT DISTINCT lexeme FROM unnest(to_tsvector(%s::regconfig, %s))) q
CROSS JOIN (
    SELECT coalesce(sum(chunks), 0)::float8 AS n,
           greatest(coalesce(sum(lexemes)::float8 / nullif(sum(chunks), 0), 1), 1) AS avgdl
    FROM knowledge_base_text_stats WHERE knowledge_base_id = ANY(%s::uuid[])
) tot
JOIN knowledge_term_stats s ON s.lexeme = q.lexeme AND s.knowledge_base_id = ANY(%s::uuid[])
GROUP BY q.lexeme, tot.n, tot.avgdl
ORDER BY q.lexeme
"""

# The chunks in scope matching the candidate query (and not the one an earlier statement
# read), ranked by the tf = 1 score; the best of them scored exactly. Per row: the
# first-pass score, the exact one (NULL past the best ``exact`` rows).
_RANK_SQL = """
WITH w AS (SELECT * FROM unnest(%s::text[], %s::float8[]) AS w(lexeme, idf)),
bound AS MATERIALIZED (
    SELECT id, search_vector AS tv, length(search_vector)::float8 AS dl,
           ({terms}) * ({k1} + 1)
               / (1 + {k1} * (1 - {b} + {b} * length(search_vector) / %s::float8)) AS first
    FROM knowledge_chunk
    WHERE ({scope}) IS TRUE AND {scoped_text} @@ (%s::tsquery && %s::tsquery){seen}
    ORDER BY first DESC, id
    LIMIT %s
)
SELECT c.id, c.first,
       sum(w.idf * u.tf * ({k1} + 1) / (u.tf + {k1} * (1 - {b} + {b} * c.dl / %s::float8)))
FROM bound c
CROSS JOIN LATERAL (
    SELECT lexeme, coalesce(array_length(positions, 1), 1) AS tf FROM unnest(c.tv)
) u
JOIN w ON w.lexeme = u.lexeme
GROUP BY c.id, c.first
"""
# The same ranking in one statement, for searches that are not pruned by ``_pruned``
# (small or filtered scopes): the idf computed in the statement, the tf = 1 terms from
# arrays; ``c``: the best chunks by the tf = 1 score, to be scored exactly.
_ONE_SQL = """
WITH tot AS (
    SELECT coalesce(sum(chunks), 0)::float8 AS n,
           greatest(coalesce(sum(lexemes)::float8 / nullif(sum(chunks), 0), 1), 1) AS avgdl
    FROM knowledge_base_text_stats WHERE knowledge_base_id = ANY(%s::uuid[])
),
w AS MATERIALIZED (
    SELECT q.lexeme, ln(1 + (tot.n - sum(s.df) + 0.5) / (sum(s.df) + 0.5)) AS idf,
           sum(s.df) AS df
    FROM (SELECT DISTINCT lexeme FROM unnest(to_tsvector(%s::regconfig, %s))) q
    CROSS JOIN tot
    JOIN knowledge_term_stats s
      ON s.lexeme = q.lexeme AND s.knowledge_base_id = ANY(%s::uuid[])
    GROUP BY q.lexeme, tot.n
),
t AS MATERIALIZED (
    SELECT array_agg(quote_literal(lexeme)::tsquery ORDER BY idf DESC, lexeme) AS qs,
           array_agg(idf ORDER BY idf DESC, lexeme) AS idf, count(*) AS n,
           string_agg(quote_literal(lexeme), ' | ')::tsquery AS q,
           array_agg(lexeme) AS lexemes,
           (SELECT avgdl FROM tot) AS avgdl{probe}
    FROM w
),{c}
SELECT c.id, sum(w.idf * u.tf * ({k1} + 1) / (u.tf + {k1} * (1 - {b} + {b} * c.dl / t.avgdl)))
    AS score, NULL::timestamptz AS o
FROM c CROSS JOIN t
CROSS JOIN LATERAL (
    SELECT lexeme, coalesce(array_length(positions, 1), 1) AS tf
    FROM unnest({query_terms})
) u
JOIN w ON w.lexeme = u.lexeme
GROUP BY c.id
ORDER BY score DESC, c.id
LIMIT %s
"""
_FIRST = "({terms}) / (1 + {k1} * (1 - {b} + {b} * length(tv) / t.avgdl))"
_C = """
c AS MATERIALIZED (
    SELECT id, tv, length(tv)::float8 AS dl FROM ({matches}
    ) m, t
    ORDER BY {first} DESC, id
    LIMIT %s
)"""
# In a scope of PROBE_MIN_ROWS chunks or more, when the query's terms are few and common
# enough that PROBE_MARGIN x ``ranked`` chunks are expected to hold them all (``t.aq``:
# terms taken as independent), the statement prunes as ``_pruned`` does, with a theta
# it finds instead of guessing: the best ``ranked`` chunks holding every term (``p``, a
# GIN lookup of their AND) are real chunks, so the ``ranked``-th best tf = 1 score
# among them (``th``) is at most the one among all matches, and the chunks that can
# reach it hold one of the minimal term sets whose bounds add up to it (``cq``: the
# function ``knowledge_bm25_sets``, migration 0021). Those are read instead of every match
# (``x``), or none more when the only set is all the terms (``p`` is the answer). The
# result is the unpruned one. A query of rare terms reads nothing more (``t.aq`` NULL:
# ``p`` stops at ``t``, the function is not called).
_PROBE_COLUMNS = """,
           CASE WHEN count(*) <= {max_terms} AND (SELECT n FROM tot) > 0 AND (SELECT n FROM tot)
                     * exp(sum(ln(least(greatest(df, 0.5) / (SELECT n FROM tot), 1)))) >= %s
                     * {margin}
                THEN string_agg(quote_literal(lexeme), ' & ')::tsquery END AS aq,
           array_agg(quote_literal(lexeme) ORDER BY idf DESC, lexeme) AS ls"""
_PROBED_C = """
p AS MATERIALIZED (
    SELECT id, tv, length(tv)::float8 AS dl, {first} AS f
    FROM ({probe}
    ) m, t
    ORDER BY f DESC, id
    LIMIT %s
),
th AS MATERIALIZED (SELECT min(f) AS theta FROM p HAVING count(*) >= %s),
cq AS MATERIALIZED (
    SELECT s.sets AS q, s.all_terms AS whole
    FROM th, t, knowledge_bm25_sets(t.ls, t.idf, {bound}, th.theta, {max_sets}, {max_set_terms}) s
),
x AS MATERIALIZED (SELECT coalesce((SELECT q FROM cq), t.q) AS q FROM t),
c AS MATERIALIZED (
    SELECT id, tv, dl FROM p WHERE (SELECT whole FROM cq)
    UNION ALL
    (SELECT id, tv, length(tv)::float8 AS dl FROM ({matches}
    ) m, t
    WHERE NOT coalesce((SELECT whole FROM cq), false)
    ORDER BY {first} DESC, id
    LIMIT %s)
)"""
# The text index (migration 0012) holds each chunk's lexemes and two tokens no text can
# give (they hold a space): its base's, ``kb <base id>``, and its session's, ``se <base
# id> <session id>``. A scope's matches are one lookup in it: the scope's tokens AND any
# query lexeme (``scope_tokens``). GIN walks the rarer posting lists and skips through
# the base's, so the scope costs next to nothing, where ANDing the matches with the bases'
# entries in the knowledge_base_id index cost as much as the bases are large (2.1 ms of
# a 2.9 ms keyword leg on a 30,000-chunk base of 100,000) and checking the base on each
# row read the matches outside it. The scope's own condition is then checked on each
# match, written (``(...) IS TRUE``) so that the planner cannot AND a b-tree index in.
SCOPED_TEXT = (
    "(search_vector || array_to_tsvector(ARRAY['kb ' || knowledge_base_id::text, "
    "'se ' || knowledge_base_id::text || ' ' || session_id]))"
)
# The leg gives no time (``o`` NULL): reading it from every match cost the leg 5% at
# 100,000 chunks; a decay reads it for the few candidates that only this leg found
# (``engine._fuse_sql``), as for the pruned leg's.
_MATCHES = """
        SELECT id, search_vector AS tv
        FROM knowledge_chunk, {source}
        WHERE {guard}({scope}) IS TRUE AND {scoped_text} @@ (%s::tsquery && {source}.{query})"""
# The query's lexemes among a chunk's, with their positions (``search_vector`` holds weight
# D only: the query's lexemes are marked A and kept). Unnesting the whole tsvector and
# joining it to the query terms cost 0.6 ms for 100 chunks of 18 lexemes.
_QUERY_TERMS = "ts_filter(setweight(c.tv, 'A', t.lexemes), '{a}')"
# Query terms in the one statement's first pass, at most (the rarest; the rest still
# match and are scored exactly).
ONE_TERMS = 32
_TERM = "CASE WHEN search_vector @@ %s::tsquery THEN %s::float8 ELSE 0 END"

# Chunks scored exactly, per chunk wanted (the rest are ranked by the tf = 1 score).
EXACT_FACTOR = 2
# Bases smaller than this rank every match, in one statement: cheap there (at 100k
# chunks, a 30,000-chunk base was faster unpruned on bench_search_ab.py).
PRUNE_MIN_ROWS = 100_000
# Unfiltered scopes from this many chunks on are pruned in the one statement when the
# query's terms are common (``_PROBED_C``). Its set-up costs a search 0.03-0.1 ms whether
# it prunes or not (1-4% of a keyword leg at 100,000 chunks); a smaller scope ranks its
# every match (at most this many, a few ms), and a filtered scope's matches are too few
# to say from its bases' statistics.
PROBE_MIN_ROWS = 5_000
# Chunks expected to hold every term, per chunk ranked, for the statement to look for
# them: a probe that finds fewer than ``ranked`` was read for nothing (29.5 ms against
# 23 unpruned for 11 words over 10,000 chunks); words of real text occur together more
# often than independent ones would, random ones (bench_stores.py) as often.
PROBE_MARGIN = 2.0
# Query terms over which candidate sets are built, at most; longer queries rank every
# chunk matching any term (no pruning).
PRUNE_MAX_TERMS = 12
# Terms (the rarest) over which theta is guessed: 2 ** GUESS_TERMS combinations.
GUESS_TERMS = 8
# Candidate sets in one tsquery, at most; past that, MaxScore's coarser query (every
# term whose bound is needed) is used.
PRUNE_MAX_SETS = 64
# Terms in those sets together, at most (past it, the same coarser query): GIN checks
# each chunk of the terms' posting lists against the whole tsquery, and 64 sets of up
# to 11 terms (989 nodes) took 111 ms over 10,000 chunks where reading every match took
# 25; 10 sets of 9 terms, 19 ms.
PRUNE_MAX_SET_TERMS = 100
# Chunks expected at or above theta, per chunk ranked (the guess is made on typical
# scores, while the statement admits every chunk whose bounds reach theta).
PRUNE_MARGIN = 1.0


def _literal(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def scope_tokens(kb_ids: list[str], session_id: str | None = None) -> str:
    """The tsquery of a scope's tokens in the text index (``SCOPED_TEXT``): any of its
    bases, or with ``session_id``, that session in any of them."""
    if session_id is None:
        return " | ".join(_literal(f"kb {kb}") for kb in kb_ids)
    return " | ".join(_literal(f"se {kb} {session_id}") for kb in kb_ids)


def _minimal_sets(bounds: list[float], theta: float) -> list[list[int]] | None:
    """Minimal index sets whose bounds add up to ``theta`` (``bounds`` sorted descending),
    or None when there are more than PRUNE_MAX_SETS or PRUNE_MAX_SET_TERMS terms in
    them together."""
    out: list[list[int]] = []
    terms = 0  # (in ``out``, together)
    suffix = [0.0] * (len(bounds) + 1)
    for i in range(len(bounds) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + bounds[i]

    def extend(start: int, total: float, chosen: list[int]) -> bool:
        nonlocal terms
        for j in range(start, len(bounds)):
            if total + suffix[j] < theta:
                return True  # the remaining terms together cannot complete a set
            if total + bounds[j] >= theta:
                out.append([*chosen, j])
                terms += len(chosen) + 1
                if len(out) > PRUNE_MAX_SETS or terms > PRUNE_MAX_SET_TERMS:
                    return False
            elif not extend(j + 1, total + bounds[j], [*chosen, j]):
                return False
        return True

    return out if extend(0, 0.0, []) else None


def candidate_query(lexemes: list[str], bounds: list[float], theta: float) -> str:
    """A tsquery matching every chunk whose terms' bounds add up to ``theta`` (any term
    for theta 0)."""
    order = sorted(range(len(lexemes)), key=lambda i: (-bounds[i], lexemes[i]))
    sets = _minimal_sets([bounds[i] for i in order], theta) if theta > 0 else None
    if sets is None:
        # Any term but the weakest ones whose bounds together stay under theta
        # (MaxScore's essential terms; all of them for theta 0).
        weak, total = 0, 0.0
        while weak < len(order) and total + bounds[order[-1 - weak]] < theta:
            total += bounds[order[-1 - weak]]
            weak += 1
        return " | ".join(_literal(lexemes[i]) for i in order[: len(order) - weak])
    return " | ".join("(" + " & ".join(_literal(lexemes[order[j]]) for j in s) + ")" for s in sets)


def _theta_guess(idf: list[float], p: list[float], n: float, want: float) -> float:
    """The typical first-pass score (idf sums: tf 1 at the average length) above which
    ``want`` chunks are expected, terms taken as independent; 0 if fewer match at all."""
    levels: list[tuple[float, float]] = []
    for mask in range(1, 1 << len(idf)):
        score, share = 0.0, 1.0
        for i in range(len(idf)):
            if mask >> i & 1:
                score += idf[i]
                share *= p[i]
            else:
                share *= 1 - p[i]
        levels.append((score, share * n))
    expected = 0.0
    for score, count in sorted(levels, reverse=True):
        expected += count
        if expected >= want:
            return score
    return 0.0


def chunk_leg(
    kb_ids: list[str],
    language: str,
    text: str,
    scope: Scope,
    limit: int,
    filtered: bool = False,
    session_id: str | None = None,
) -> Leg | None:
    """The keyword leg of a chunk search: (chunk id, BM25 score) best first, for the
    chunks of ``scope`` holding any query lexeme; None for a text without words.

    ``scope``: the bases and filters (its ``rows``: the bases' size, when known);
    ``filtered``: whether it holds more than the bases; ``session_id``: the session it is
    filtered to. A small or filtered scope is ranked in one statement (``_ONE_SQL``, run
    inside the search's); a large one is pruned (``_RANK_SQL``), here, apart.
    """
    if not re.search(r"\w", text):
        return None
    rows = scope.rows
    if filtered or (rows is not None and rows < PRUNE_MIN_ROWS):
        tokens = scope_tokens(kb_ids, session_id)
        probe = not filtered and rows is not None and rows >= PROBE_MIN_ROWS
        sql, params = one_statement_sql(
            language, text, scope.sql, scope.params, kb_ids, limit, tokens, probe
        )
        return Leg("/* keyword leg */" + sql, params, [])
    return Leg("", [], [], produce=lambda: _pruned(kb_ids, language, text, scope.sql,
                                                   scope.params, limit))  # fmt: skip


def _pruned(
    kb_ids: list[str], language: str, text: str, scope: str, scope_params: list[Any], limit: int
) -> list[tuple[Any, ...]]:
    """``_RANK_SQL``'s ranking of a large unfiltered scope (see the module)."""
    terms, _ = fetch(_TERMS_SQL, [language, text, kb_ids, kb_ids])
    if not terms:
        return []
    k1, b = K1, B
    n, avgdl = float(terms[0][2]), float(terms[0][3])
    lexemes = [t[0] for t in terms]
    idf = [math.log(1 + (n - t[1] + 0.5) / (t[1] + 0.5)) for t in terms]
    bounds = [w * (k1 + 1) / (1 + k1 * max(1 - b, 0.0)) for w in idf]
    ranked = limit * EXACT_FACTOR
    theta = 0.0
    if n >= PRUNE_MIN_ROWS and len(terms) <= PRUNE_MAX_TERMS:
        rarest = sorted(range(len(terms)), key=lambda i: -idf[i])[:GUESS_TERMS]
        theta = _theta_guess(
            [idf[i] for i in rarest],
            [min(terms[i][1] / n, 1.0) for i in rarest],
            n,
            PRUNE_MARGIN * ranked,
        )
    sql = _RANK_SQL.replace("{terms}", " + ".join([_TERM] * len(terms)))
    term_params = [v for pair in zip([_literal(x) for x in lexemes], idf) for v in pair]
    tokens = scope_tokens(kb_ids)  # (a pruned scope is whole bases)

    def rank(query: str, seen: str | None) -> list[tuple[int, float, float]]:
        # The scope's matches from the text index alone (``SCOPED_TEXT``).
        text_sql = sql.format(
            k1=repr(k1),
            b=repr(b),
            scope=scope,
            scoped_text=SCOPED_TEXT,
            seen="" if seen is None else " AND NOT search_vector @@ %s::tsquery",
        )
        params = [lexemes, idf, *term_params, avgdl, *scope_params, tokens, query]
        params += [] if seen is None else [seen]
        # Planned for its values each time: a generic plan cannot know how many chunks
        # the query matches, and may scan the table.
        rows, _ = fetch(text_sql, [*params, ranked, avgdl], prepare=False)
        return [(row[0], float(row[1]), float(row[2])) for row in rows]

    query = candidate_query(lexemes, bounds, theta)
    found = rank(query, None)
    found.sort(key=lambda r: (-r[1], r[0]))
    if theta > 0 and not (len(found) >= ranked and found[-1][1] >= theta):
        # The guess was too high: the last first-pass score found (or 0) is a safe
        # theta; rank what it admits that the first statement did not read.
        theta = found[-1][1] if len(found) >= ranked else 0.0
        again = candidate_query(lexemes, bounds, theta)
        if again != query:  # (the same sets: nothing left unread)
            found += rank(again, query)
            found = sorted(found, key=lambda r: (-r[1], r[0]))[:ranked]
    best = sorted(found, key=lambda r: (-r[2], r[0]))[:limit]
    return [(chunk_id, score) for chunk_id, _, score in best]


def _first_pass_terms(slots: int) -> str:
    """The tf = 1 score's sum over the query's terms: a slot per lexeme the text could
    give (a hyphenated word gives up to three), each slot inside the one before, so that
    a row's evaluation stops at the first slot past the terms (``t.n``) rather than
    testing every empty one (24 empty slots cost 3.5 ms of a 23 ms leg over 10,000
    chunks: each reads its element of ``t.qs`` by walking the array)."""

    def term(i: int) -> str:
        return f"CASE WHEN tv @@ t.qs[{i}] THEN t.idf[{i}] ELSE 0 END"

    if slots <= 0:
        return "0"
    sql = term(slots)
    for i in range(slots - 1, 0, -1):
        sql = f"{term(i)} + (CASE WHEN t.n < {i + 1} THEN 0 ELSE {sql} END)"
    return sql


def one_statement_sql(
    language: str,
    text: str,
    scope: str,
    scope_params: list[Any],
    kb_ids: list[str],
    limit: int,
    tokens: str,
    probe: bool = False,
) -> tuple[str, list[Any]]:
    """The unpruned ranking as one statement (``_ONE_SQL``) and its parameters: rows
    (chunk id, BM25 score), best first, ``limit`` of them at most. ``tokens``: the
    scope's tokens (``scope_tokens``); ``probe``: prune a query of common terms as
    ``_PROBED_C`` does (a scope of PROBE_MIN_ROWS chunks or more)."""
    slots = min(ONE_TERMS, 2 * len(re.findall(r"\w+", text)))
    terms = _first_pass_terms(slots)
    k1, b = K1, B
    ranked = limit * EXACT_FACTOR
    parts = {"k1": repr(k1), "b": repr(b)}
    first = _FIRST.format(terms=terms, **parts)
    matched = [*scope_params, tokens]
    if probe:
        c = _PROBED_C.format(
            probe=_MATCHES.format(scope=scope, scoped_text=SCOPED_TEXT, source="t", query="aq",
                                  guard="t.aq IS NOT NULL AND "),
            matches=_MATCHES.format(scope=scope, scoped_text=SCOPED_TEXT, source="x", query="q",
                                    guard=""),
            first=first, bound=f"(1 + {k1!r} * (1 - {b!r}))", max_sets=PRUNE_MAX_SETS,
            max_set_terms=PRUNE_MAX_SET_TERMS,
        )  # fmt: skip
        # (every term in the first pass's slots: at most PRUNE_MAX_TERMS of them)
        columns = _PROBE_COLUMNS.format(
            max_terms=min(slots, PRUNE_MAX_TERMS), margin=repr(PROBE_MARGIN)
        )
        params = [ranked, *matched, ranked, ranked, *matched, ranked]
    else:
        c = _C.format(
            matches=_MATCHES.format(
                scope=scope, scoped_text=SCOPED_TEXT, source="t", query="q", guard=""
            ),
            first=first,
        )
        columns, params = "", [*matched, ranked]
    sql = _ONE_SQL.format(probe=columns, c=c, query_terms=_QUERY_TERMS, **parts)
    return sql, [kb_ids, language, text, kb_ids, *params, limit]


# --- BM25 with statistics counted as it goes (facts, store items) -----------------------
# Collections whose scopes are small enough that every row holding a query word is read
# to be scored: the document frequencies are counted from those rows, exact and at no
# extra read; N and the total length come from counters on the scope's own row, kept by
# triggers (one row read, where a count of a 10,000-row scope's lengths would read every
# row: BENCHMARKS.md, "Memory engine, fifth pass"). The rows of a scope hold its token in
# their text vector (``token``: a lexeme no text can give), so its matches are one GIN
# lookup of the query's lexemes AND the token; ``dl`` leaves the token out.
# At most this many matching rows are read and scored, the newest: a query whose words
# most of a large scope holds (9,449 of a 10,000-item store) scored every one of them
# (0.5 s, a row's text vector fetched from TOAST several times). Past it, a word's
# document frequency is estimated from the sample (scaled by matches / sample); up to
# it, every statistic is exact. Each row's vector is fetched once (``setweight(tv, 'D')``
# copies it out of TOAST: the later uses read the copy).
COUNTED_SAMPLE = 500
_COUNTED_SQL = """WITH q AS MATERIALIZED (
    SELECT coalesce((SELECT string_agg(quote_literal(l), ' | ') FROM unnest(x.ls) l), '')::tsquery
           AS words, x.ls AS lexemes, quote_literal(%s)::tsquery AS scope
    FROM (SELECT tsvector_to_array(to_tsvector(%s::regconfig, %s)) AS ls) x
),{walk_ctes}
kr AS MATERIALIZED ({matches}
),
km AS MATERIALIZED (
    SELECT x.id, x.o, x.ok, x.matched, length(x.v) - 1 AS dl,
           ts_filter(setweight(x.v, 'A', q.lexemes), '{{a}}') AS qv
    FROM (SELECT id, o, ok, matched, {copy} AS v FROM kr OFFSET 0) x, q
),
kt AS MATERIALIZED (
    SELECT m.id, u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf, u.k
    FROM km m, unnest(m.qv) WITH ORDINALITY u(lexeme, positions, weights, k)
),
ks AS MATERIALIZED (
    SELECT t.n::float8 AS n, greatest(t.l, 1)::float8 / greatest(t.n, 1)::float8 AS avgdl,
           (SELECT max(matched)::float8 / count(*)::float8 FROM km) AS scale
    FROM ({totals}) t(n, l) WHERE EXISTS (SELECT 1 FROM km)
),
ki AS MATERIALIZED (
    SELECT t.lexeme, ln(1::float8 + (k.n - count(*) * k.scale + 0.5::float8)
           / (count(*) * k.scale + 0.5::float8)) AS idf
    FROM kt t, ks k GROUP BY t.lexeme, k.n, k.scale
)
SELECT m.id, sum(i.idf * t.tf * ({k1}::float8 + 1::float8) / (t.tf + {k1}::float8
       * (1::float8 - {b}::float8 + {b}::float8 * m.dl / k.avgdl)) ORDER BY t.k) AS score, m.o
FROM km m JOIN kt t ON t.id = m.id JOIN ki i ON i.lexeme = t.lexeme CROSS JOIN ks k
WHERE m.ok GROUP BY m.id, m.o ORDER BY score DESC, m.o DESC, m.id LIMIT {pool}"""


_COUNTED_MATCHES = """
    SELECT r.*, count(*) OVER () AS matched FROM (
        SELECT id, {column} AS tv, {newest} AS o, ({filter}) AS ok FROM {table}, q
        WHERE numnode(q.words) > 0 AND {column} @@ (q.words && q.scope){extra}
    ) r ORDER BY r.o DESC NULLS LAST, r.id DESC LIMIT {sample}"""
# With a ``walk`` (the scope as a predicate one btree index serves in ``newest`` order),
# past the sample the newest ``sample`` matches are found by walking that index newest
# first, each row's text vector tested as it passes (``kx``: about ``sample`` rows read
# when most rows match), instead of reading every match to count and order them; the
# matches are estimated from the walk's share (``sample`` of the rows it passed) times
# the scope's rows. Which rows are scored and how never depends on how the statement
# finds them; only the cost does (``kd``):
# - a scope of fewer than 2 x ``sample`` rows, or whose newest COUNTED_PROBE rows hold
#   fewer than 2 x ``sample`` x their share of the scope's rows: the matches are counted
#   through the GIN up to one past the sample (``kc``: it stops there), then read from
#   it (up to the sample: every match) or walked (``kx``, past it);
# - otherwise (a query most of a large scope matches), the walk comes first (``kw``:
#   the newest matches among the newest COUNTED_WALK_BOUND x ``sample`` rows, up to one
#   past the sample),
#   without the GIN count (1-2 ms where most of 10,000 rows match); one past the
#   sample found, it is the walked sample; the whole scope walked, its matches are every
#   match; else (fewer there than the newest rows promised) the GIN count decides as
#   above.
# A walked row's text vector is copied once (``setweight(.., 'D')``): it is out of line
# (TOAST) in a row holding a vector, and each use of it fetched it again. A row's terms
# are added in the order of its lexemes (``t.k``), whatever the plan: rows whose terms
# are the same get the same score to the bit, and their tie goes to the newer.
COUNTED_PROBE = 100
# The rows a walk that comes first reads at most, per row of the sample.
COUNTED_WALK_BOUND = 2
_WALKED_MATCHES = """
    SELECT id, tv, o, ok, round({sample}::float8 * t.n / greatest((SELECT max(pos) FROM
           (SELECT pos FROM kw ORDER BY pos LIMIT {sample}) p), 1)) AS matched
    FROM (SELECT * FROM kw ORDER BY pos LIMIT {sample}) w, ({totals}) t(n, l)
    WHERE (SELECT how FROM kd) = 'walked'
    UNION ALL
    SELECT id, tv, o, ok, count(*) OVER () FROM kw WHERE (SELECT how FROM kd) = 'all'
    UNION ALL
    SELECT r.id, setweight(r.tv, 'D'), r.o, r.ok, count(*) OVER () FROM (
        SELECT id, {column} AS tv, {newest} AS o, ({filter}) AS ok FROM {table}, q
        WHERE numnode(q.words) > 0 AND {column} @@ (q.words && q.scope)
    ) r WHERE (SELECT how FROM kd) = 'counted' AND (SELECT n FROM kc) <= {sample}
    UNION ALL
    SELECT id, tv, o, ok, round({sample}::float8 * t.n / greatest((SELECT max(pos) FROM kx), 1))
    FROM kx, ({totals}) t(n, l)
    WHERE (SELECT how FROM kd) = 'counted' AND (SELECT n FROM kc) > {sample}"""
# The newest matches of a walk (``{bound}``: a LIMIT on the rows walked, or nothing),
# each with its place in the walk (``pos``: rows passed, itself included).
_WALK = """
    SELECT w.id, w.tv, w.o, w.ok, w.pos FROM (
        SELECT id, setweight({column}, 'D') AS tv, {newest} AS o, ({filter}) AS ok,
               row_number() OVER (ORDER BY {newest} DESC, id DESC) AS pos
        FROM {table} WHERE {walk} ORDER BY {newest} DESC, id DESC{bound}
    ) w WHERE coalesce(w.tv @@ (SELECT words FROM q), false)  -- (tested row by row, walked)
    ORDER BY w.o DESC, w.id DESC LIMIT {limit}"""
_WALK_CTES = """
kp AS MATERIALIZED (
    SELECT t.n >= 2 * {sample} AND (
        SELECT x.m > 0 AND x.m * t.n >= 2 * {sample} * x.c FROM (
            SELECT count(*) FILTER (WHERE coalesce(p.tv @@ (SELECT words FROM q), false)) AS m,
                   count(*) AS c
            FROM (SELECT {column} AS tv FROM {table} WHERE {walk}
                  ORDER BY {newest} DESC, id DESC LIMIT {probe}) p
        ) x
    ) AS walk
    FROM ({totals}) t(n, l)
),
kw AS MATERIALIZED ({first_walk}),
kn AS MATERIALIZED (
    SELECT count(*) > {rows} AS more FROM (SELECT 1 FROM {table} WHERE {walk} LIMIT {rows} + 1) x
),
kd AS MATERIALIZED (
    SELECT CASE WHEN NOT coalesce((SELECT walk FROM kp), false) THEN 'counted'
                WHEN (SELECT count(*) FROM kw) > {sample} THEN 'walked'
                WHEN NOT (SELECT more FROM kn) THEN 'all' ELSE 'counted' END AS how
),
kc AS MATERIALIZED (
    SELECT count(*) AS n FROM (SELECT 1 FROM {table}, q WHERE numnode(q.words) > 0
        AND {column} @@ (q.words && q.scope) LIMIT {sample} + 1) x
),
kx AS MATERIALIZED ({walk_on}),"""


def counted_leg(
    *,
    table: str,
    token: str,
    text: str,
    totals: tuple[str, list[Any]],
    pool: int,
    language: str = "english",
    newest: str = "NULL::timestamptz",
    filter: tuple[str, list[Any]] = ("true", []),
    extra: tuple[str, list[Any]] | None = None,
    walk: tuple[str, list[Any]] | None = None,
) -> Leg | None:
    """The keyword leg of a scope whose rows hold ``token``: (id, BM25 score) of the
    ``pool`` best rows holding a word of ``text`` and passing ``filter`` (ties: the
    newer ``newest`` first, then id), None for a text without words. The statistics are
    the whole scope's, whatever the filter: ``totals`` gives its row count and total
    length in lexemes (the token left out). ``extra``: more matching rows of the scope
    that do not hold its token (the facts a scope shares), as (id, tv, o, ok) over ``q``
    (``words``: the query's tsquery). ``walk``: the scope as a predicate a btree index
    on it and ``newest`` serves (see ``_WALKED_MATCHES``; not with ``extra``)."""
    if not re.search(r"\w", text):
        return None
    parts = dict(
        column="search_vector", newest=newest, filter=filter[0], table=table,
        extra="" if extra is None else f" UNION ALL {extra[0]}", totals=totals[0],
        sample=COUNTED_SAMPLE, walk=walk[0] if walk else "", probe=COUNTED_PROBE,
        rows=COUNTED_WALK_BOUND * COUNTED_SAMPLE,
    )  # fmt: skip
    walk_ctes = ""
    if walk is not None:
        walk_ctes = _WALK_CTES.format(
            **parts,
            first_walk=_WALK.format(**parts, bound=f" LIMIT {parts['rows']}",
                                    limit=f"{COUNTED_SAMPLE} + 1"),
            walk_on=_WALK.format(**parts, bound="", limit=COUNTED_SAMPLE),
        )  # fmt: skip
    sql = _COUNTED_SQL.format(
        **parts, k1=repr(K1), b=repr(B), pool=int(pool), walk_ctes=walk_ctes,
        copy="setweight(tv, 'D')" if walk is None else "tv",
        matches=(_WALKED_MATCHES if walk else _COUNTED_MATCHES).format(**parts),
    )  # fmt: skip
    if walk is None:
        params = [*filter[1], *(extra[1] if extra else [])]
    else:  # (kp, kw, kn, kx, then kr's four branches)
        f, w, t = filter[1], walk[1], totals[1]
        params = [*w, *t, *f, *w, *w, *f, *w, *t, *f, *t]
    return Leg("/* keyword leg */" + sql, [token, language, text, *params, *totals[1]], [])
