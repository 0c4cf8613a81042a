"""Full-text column and the vector indexes.

``search_vector`` is a stored generated column: PostgreSQL keeps it current from
``text`` and the row's ``fts_config``. Each HNSW index is a partial expression index
for one dimension (pgvector indexes need a fixed dimension; the column has none so
that bases of different models share the table). Indexes are built concurrently,
outside a transaction, so a large table stays writable while they build.
"""

from django.db import migrations

from knowledge.models import INDEXED_DIMENSIONS


def _hnsw(dim: int) -> migrations.RunSQL:
    return migrations.RunSQL(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_embedding_hnsw_{dim} "
        f"ON knowledge_chunk USING hnsw ((embedding::vector({dim})) vector_cosine_ops) "
        f"WITH (m = 16, ef_construction = 64) WHERE dimensions = {dim}",
        f"DROP INDEX CONCURRENTLY IF EXISTS chunk_embedding_hnsw_{dim}",
    )


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE knowledge_chunk ADD COLUMN search_vector tsvector "
            "GENERATED ALWAYS AS (to_tsvector(fts_config, text)) STORED",
            "ALTER TABLE knowledge_chunk DROP COLUMN search_vector",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_search_vector_gin "
            "ON knowledge_chunk USING gin (search_vector)",
            "DROP INDEX CONCURRENTLY IF EXISTS chunk_search_vector_gin",
        ),
        *[_hnsw(dim) for dim in INDEXED_DIMENSIONS],
    ]
