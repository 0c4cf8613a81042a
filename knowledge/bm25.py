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
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection

_SQL = """
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
query AS (
    SELECT coalesce(string_agg(quote_literal(lexeme), ' | '), '')::tsquery AS q FROM w
),
cand AS (
    SELECT id, search_vector FROM knowledge_chunk, query WHERE {scope} AND search_vector @@ query.q
)
SELECT c.id, sum(
    w.idf * u.tf * ({k1} + 1) / (u.tf + {k1} * (1 - {b} + {b} * length(c.search_vector) / tot.avgdl))
) AS score
FROM tot, cand c
CROSS JOIN LATERAL (
    SELECT lexeme, coalesce(array_length(positions, 1), 1) AS tf FROM unnest(c.search_vector)
) u
JOIN w ON w.lexeme = u.lexeme
GROUP BY c.id
ORDER BY score DESC, c.id
LIMIT %s
"""


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
    k1, b = float(settings.SEARCH_BM25_K1), float(settings.SEARCH_BM25_B)
    sql = _SQL.format(scope=scope, k1=repr(k1), b=repr(b))
    with connection.cursor() as cur:
        cur.execute(sql, [kb_ids, language, text, kb_ids, *scope_params, limit])
        return [(row[0], float(row[1])) for row in cur.fetchall()]
