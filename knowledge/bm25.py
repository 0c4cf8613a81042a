"""BM25 ranking of chunks in plain PostgreSQL.

The lexemes come from ``search_vector`` (the base's text-search configuration: its
stemming and stop words), the statistics from ``knowledge_term_stats`` and
``knowledge_base_text_stats``, which triggers keep exact in every chunk write's
transaction (migration 0008). A chunk's score is the sum, over the query's lexemes it
holds, of

    idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))

with N the chunks of the searched bases, df those holding t, tf the occurrences of t in
the chunk and dl its length in distinct lexemes (``length(search_vector)``; avgdl its
mean over the bases). Unlike ``ts_rank``, a word that is rare in the base (a name, "LGBTQ")
weighs more than one every chunk has.

Only the chunks ranked best by the tf = 1 bound (EXACT_FACTOR x the chunks wanted) are
scored with their term frequencies: short chunks (messages, turns) rarely repeat a word,
and the bound costs about what ``ts_rank`` did per matching row.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.db import connection

# One statement: the query's lexemes with their idf (from the statistics), the matching
# chunks ranked by a bound, every matched term counted once (tf = 1: one tsvector lookup
# per query term and row, about what ts_rank costs), then the exact score, with each
# term's frequency, for the best of them only.
_RANK_SQL = """
WITH tot AS (
    SELECT coalesce(sum(chunks), 0)::float8 AS n,
           greatest(coalesce(sum(lexemes)::float8 / nullif(sum(chunks), 0), 1), 1) AS avgdl
    FROM knowledge_base_text_stats WHERE knowledge_base_id = ANY(%s::uuid[])
),
w AS MATERIALIZED (
    SELECT q.lexeme,
           ln(1 + (tot.n - coalesce(sum(s.df), 0) + 0.5) / (coalesce(sum(s.df), 0) + 0.5)) AS idf
    FROM (SELECT DISTINCT lexeme FROM unnest(to_tsvector(%s::regconfig, %s))) q
    CROSS JOIN tot
    LEFT JOIN knowledge_term_stats s
           ON s.lexeme = q.lexeme AND s.knowledge_base_id = ANY(%s::uuid[])
    GROUP BY q.lexeme, tot.n
),
t AS MATERIALIZED (
    SELECT array_agg(quote_literal(lexeme)::tsquery ORDER BY idf DESC, lexeme) AS qs,
           array_agg(idf ORDER BY idf DESC, lexeme) AS idf,
           string_agg(quote_literal(lexeme), ' | ')::tsquery AS q,
           (SELECT avgdl FROM tot) AS avgdl
    FROM w
),
bound AS MATERIALIZED (
    SELECT id, search_vector AS tv, length(search_vector)::float8 AS dl
    FROM knowledge_chunk, t
    WHERE {scope} AND search_vector @@ t.q
    ORDER BY ({terms}) / (1 + {k1} * (1 - {b} + {b} * length(search_vector) / t.avgdl)) DESC, id
    LIMIT %s
)
{scored}"""

# The exact score of the rows of ``c`` (columns id, tv, dl) for the lexemes of ``w``.
_SCORED = """
SELECT c.id, sum(w.idf * u.tf * ({k1} + 1) / (u.tf + {k1} * (1 - {b} + {b} * c.dl / {avgdl})))
    AS score
FROM {source}
CROSS JOIN LATERAL (
    SELECT lexeme, coalesce(array_length(positions, 1), 1) AS tf FROM unnest(c.tv)
) u
JOIN w ON w.lexeme = u.lexeme
GROUP BY c.id
ORDER BY score DESC, c.id
LIMIT %s
"""

# Chunks scored exactly, per chunk wanted (the rest are ranked by the tf = 1 bound).
EXACT_FACTOR = 2
# Query terms in the bound, at most (rarest first; the rest still match and are scored).
BOUND_TERMS = 32


def bm25_ranking(
    kb_ids: list[str],
    language: str,
    text: str,
    scope: str,
    scope_params: list[Any],
    limit: int,
) -> list[tuple[int, float]]:
    """[(chunk id, BM25 score)] best first, for the chunks holding any query lexeme.

    ``scope``/``scope_params``: the WHERE clause of the search (bases and filters), as
    ``search._scope_sql`` builds it.
    """
    # Lexemes are unknown until the statement runs: the bound has a slot for as many as
    # the text could give (a hyphenated word gives up to three), empty slots add 0.
    slots = min(BOUND_TERMS, 2 * len(re.findall(r"\w+", text)))
    if not slots:
        return []
    bound_terms = " + ".join(
        f"CASE WHEN search_vector @@ t.qs[{i}] THEN t.idf[{i}] ELSE 0 END"
        for i in range(1, slots + 1)
    )
    k1, b = float(settings.SEARCH_BM25_K1), float(settings.SEARCH_BM25_B)
    scored = _SCORED.format(source="bound c, t", k1=repr(k1), b=repr(b), avgdl="t.avgdl")
    sql = _RANK_SQL.format(scope=scope, terms=bound_terms, k1=repr(k1), b=repr(b), scored=scored)
    with connection.cursor() as cur:
        cur.execute(
            sql, [kb_ids, language, text, kb_ids, *scope_params, limit * EXACT_FACTOR, limit]
        )
        return [(row[0], float(row[1])) for row in cur.fetchall()]


_ADHOC_SQL = """
WITH docs AS MATERIALIZED (
    SELECT d.id, tv, length(tv)::float8 AS dl
    FROM ({docs}) d, to_tsvector(%s::regconfig, d.text) tv
),
tot AS (
    SELECT count(*)::float8 AS n, greatest(coalesce(avg(length(tv)), 1), 1) AS avgdl FROM docs
),
q AS (SELECT DISTINCT lexeme FROM unnest(to_tsvector(%s::regconfig, %s))),
w AS MATERIALIZED (
    SELECT q.lexeme, ln(1 + (tot.n - count(d.id) + 0.5) / (count(d.id) + 0.5)) AS idf
    FROM q CROSS JOIN tot LEFT JOIN docs d ON d.tv @@ quote_literal(q.lexeme)::tsquery
    GROUP BY q.lexeme, tot.n
)
{scored}"""


def bm25_adhoc(
    docs_sql: str, docs_params: list[Any], language: str, text: str, limit: int
) -> list[tuple[Any, float]]:
    """BM25 over a small set of texts with no stored statistics (a user's memories).

    ``docs_sql`` selects ``id`` and ``text``; the statistics (N, df, average length)
    are computed over that set on the fly, so it should stay small (hundreds of rows).
    """
    k1, b = float(settings.SEARCH_BM25_K1), float(settings.SEARCH_BM25_B)
    scored = _SCORED.format(source="tot, docs c", k1=repr(k1), b=repr(b), avgdl="tot.avgdl")
    sql = _ADHOC_SQL.format(docs=docs_sql, scored=scored)
    with connection.cursor() as cur:
        cur.execute(sql, [*docs_params, language, language, text, limit])
        return [(row[0], float(row[1])) for row in cur.fetchall()]
