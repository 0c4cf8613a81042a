"""Deferred HNSW indexing and embeddings stored inline.

- ``index_pending``: ingestion writes rows with ``index_pending = true`` and a
  background task (``knowledge.tasks.index_pending_chunks``) flips it in batches.
  The HNSW indexes are recreated to cover ``NOT index_pending`` rows only, so a
  write no longer pays ~2-4 ms per vector of HNSW insertion; searches rank the
  pending rows exactly (``chunk_kb_index_pending``) next to the index scan.
  Existing rows keep ``false``: they are in the index already.
- Embeddings inline: pgvector's type defaults to ``STORAGE EXTERNAL``, so a
  384-dimension vector (1.5 kB) plus text pushed every row past the 2 kB toast
  threshold and each exact-scan row needed a TOAST lookup. ``STORAGE MAIN`` and
  ``toast_tuple_target = 8160`` keep the vector (and the tsvector the keyword
  ranking reads) in the row unless a row would not fit on a page. Rows written
  before this migration stay toasted until rewritten (``VACUUM FULL
  knowledge_chunk`` or re-ingestion); they work either way.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from knowledge.models import INDEXED_DIMENSIONS


def _hnsw(dim: int) -> list[migrations.RunSQL]:
    old = (
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_embedding_hnsw_{dim} "
        f"ON knowledge_chunk USING hnsw ((embedding::vector({dim})) vector_cosine_ops) "
        f"WITH (m = 16, ef_construction = 64) WHERE dimensions = {dim}"
    )
    new = (
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_hnsw_{dim} "
        f"ON knowledge_chunk USING hnsw ((embedding::vector({dim})) vector_cosine_ops) "
        f"WITH (m = 16, ef_construction = 64) WHERE dimensions = {dim} AND NOT index_pending"
    )
    # The new index is built before the old one goes, so searches keep an index.
    return [
        migrations.RunSQL(new, f"DROP INDEX CONCURRENTLY IF EXISTS chunk_hnsw_{dim}"),
        migrations.RunSQL(f"DROP INDEX CONCURRENTLY IF EXISTS chunk_embedding_hnsw_{dim}", old),
    ]


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0003_backfill_source_timestamp")]

    operations = [
        migrations.AddField(
            model_name="chunk",
            name="index_pending",
            field=models.BooleanField(default=False, editable=False),
        ),
        AddIndexConcurrently(
            model_name="chunk",
            index=models.Index(
                condition=models.Q(("index_pending", True)),
                fields=["knowledge_base"],
                name="chunk_kb_index_pending",
            ),
        ),
        migrations.RunSQL(
            "ALTER TABLE knowledge_chunk ALTER COLUMN embedding SET STORAGE MAIN, "
            "SET (toast_tuple_target = 8160)",
            "ALTER TABLE knowledge_chunk ALTER COLUMN embedding SET STORAGE EXTERNAL, "
            "RESET (toast_tuple_target)",
        ),
        *[op for dim in INDEXED_DIMENSIONS for op in _hnsw(dim)],
    ]
