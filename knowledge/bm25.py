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

from typing import Any

from django.conf import settings
from django.db import connection

_TERMS_SQL = """
WITH tot AS (
    SELECT coalesce(sum(chunks), 0)::float8 AS n,
           greatest(coalesce(sum(lexemes)::float8 / nullif(sum(chunks), 0), 1), 1) AS avgdl
    FROM knowledge_base_text_stats WHERE knowledge_base_id = ANY(%s::uuid[])
)
SELECT q.lexeme,
       ln(1 + (tot.n - coalesce(sum(s.df), 0) + 0.5) / (coalesce(sum(s.df), 0) + 0.5)) AS idf,
       tot.avgdl
FROM (SELECT DISTINCT lexeme FROM unnest(to_tsvector(%s::regconfig, %s))) q
CROSS JOIN tot
LEFT JOIN knowledge_term_stats s
       ON s.lexeme = q.lexeme AND s.knowledge_base_id = ANY(%s::uuid[])
GROUP BY q.lexeme, tot.n, tot.avgdl
ORDER BY idf DESC, q.lexeme
"""

# First the matching chunks by a bound: every matched term counted once (tf = 1), which
# needs one tsvector lookup per query term and row (about what ts_rank costs); then the
# exact score, with each term's frequency, for the best of them only.
_RANK_SQL = """
WITH w(lexeme, idf) AS (SELECT * FROM unnest(%s::text[], %s::float8[])),
bound AS MATERIALIZED (
    SELECT id, search_vector AS tv, length(search_vector)::float8 AS dl
    FROM knowledge_chunk
    WHERE {scope} AND search_vector @@ %s::tsquery
    ORDER BY ({terms}) / (1 + {k1} * (1 - {b} + {b} * length(search_vector) / {avgdl})) DESC, id
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
EXACT_FACTOR = 4


def _tsquery_literal(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


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
    ``search._scope_sql`` builds it. Two statements: the query's lexemes with their idf
    (from the statistics), then the ranking.
    """
    with connection.cursor() as cur:
        cur.execute(_TERMS_SQL, [kb_ids, language, text, kb_ids])
        terms = cur.fetchall()
        if not terms:
            return []
        lexemes = [t[0] for t in terms]
        idfs = [float(t[1]) for t in terms]
        avgdl = float(terms[0][2])
        k1, b = float(settings.SEARCH_BM25_K1), float(settings.SEARCH_BM25_B)
        bound_terms = " + ".join(
            f"CASE WHEN search_vector @@ %s::tsquery THEN {idf!r} ELSE 0 END" for idf in idfs
        )
        scored = _SCORED.format(source="bound c", k1=repr(k1), b=repr(b), avgdl=repr(avgdl))
        sql = _RANK_SQL.format(
            scope=scope, terms=bound_terms, k1=repr(k1), b=repr(b), avgdl=repr(avgdl), scored=scored
        )
        literals = [_tsquery_literal(x) for x in lexemes]
        cur.execute(
            sql,
            [lexemes, idfs, *scope_params, " | ".join(literals), *literals,
             limit * EXACT_FACTOR, limit],
        )  # fmt: skip
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
