"""``knowledge_bm25_sets``: the minimal sets of query terms whose score bounds add up to a
threshold, as one tsquery (their OR), for the keyword leg's one statement
(``knowledge.retrieval.bm25._PROBED_C``).

A function, not part of the statement: the enumeration (a recursive query) is planned
and initialised only when a search calls it, where inside the statement every search
paid its executor set-up (0.1 ms of a 4 ms keyword leg) whether it pruned or not.
Computation only: no table is read.
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION knowledge_bm25_sets(
    literals text[], idf float8[], factor float8, theta float8, max_sets integer,
    max_terms integer, OUT sets tsquery, OUT all_terms boolean
) LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
BEGIN
    -- literals: the terms as quoted tsquery literals, by idf descending; a term's bound
    -- is its idf / factor. A set is minimal in the order of the terms: it stops growing
    -- once it reaches theta. NULL sets when there are more than max_sets, or more than
    -- max_terms terms in them together.
    WITH RECURSIVE tb AS (
        SELECT i, literals[i] AS l, idf[i] / factor AS ub,
               sum(idf[i]) OVER (ORDER BY i DESC) / factor AS suffix
        FROM generate_series(1, coalesce(array_length(idf, 1), 0)) i
    ),
    ms(last, total, terms, k) AS (
        SELECT tb.i, tb.ub, tb.l, 1 FROM tb WHERE tb.suffix >= theta
        UNION ALL
        SELECT tb.i, ms.total + tb.ub, ms.terms || ' & ' || tb.l, ms.k + 1
        FROM ms, tb
        WHERE tb.i > ms.last AND ms.total < theta AND ms.total + tb.suffix >= theta
    )
    SELECT CASE WHEN count(*) <= max_sets AND sum(ms.k) <= max_terms
                THEN string_agg('(' || ms.terms || ')', ' | ')::tsquery END,
           count(*) = 1 AND min(ms.k) = coalesce(array_length(idf, 1), 0)
    INTO sets, all_terms
    FROM ms WHERE ms.total >= theta;
END
$fn$;
"""


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0020_chunk_half_plain")]

    operations = [
        migrations.RunSQL(
            FUNCTION,
            "DROP FUNCTION IF EXISTS knowledge_bm25_sets(text[], float8[], float8, float8, integer, integer)",
        )
    ]
