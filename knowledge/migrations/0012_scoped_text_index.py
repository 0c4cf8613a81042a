"""The chunks' text index with each chunk's base and session as tokens.

``chunk_scoped_text_gin`` indexes ``search_vector`` plus two lexemes no text can give
(they hold a space): ``kb <base id>`` and ``se <base id> <session id>``. A keyword
search's matches in its scope are then one GIN lookup, ``(scope tokens) & (any query
lexeme)`` (``knowledge.bm25.SCOPED_TEXT``, whose expression this index must be), where
the planner ANDed the plain index's matches with the bases' entries in the
``knowledge_base_id`` index: as costly as the bases are large. The plain index
(``chunk_search_vector_gin``, 0002) had no other user (the admin's search ranks by each
row's configuration, which no index serves) and is dropped once the new one is built.
Both concurrently, outside a transaction: the table stays writable meanwhile.
"""

from django.db import migrations

SCOPED_TEXT = (
    "(search_vector || array_to_tsvector(ARRAY['kb ' || knowledge_base_id::text, "
    "'se ' || knowledge_base_id::text || ' ' || session_id]))"
)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0011_chunk_hnsw_halfvec")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_scoped_text_gin "
            f"ON knowledge_chunk USING gin ({SCOPED_TEXT})",
            "DROP INDEX CONCURRENTLY IF EXISTS chunk_scoped_text_gin",
        ),
        migrations.RunSQL(
            "DROP INDEX CONCURRENTLY IF EXISTS chunk_search_vector_gin",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_search_vector_gin "
            "ON knowledge_chunk USING gin (search_vector)",
        ),
    ]
