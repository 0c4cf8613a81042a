"""HNSW indexes over fact vectors, one partial expression index per dimension (the
column has none: facts of different embedders share the table), built concurrently.
Large scopes find a new fact's nearest neighbour through them (the semantic duplicate
check) instead of scanning every fact of the scope."""

from django.db import migrations

from knowledge.models import INDEXED_DIMENSIONS


def _hnsw(dim: int) -> migrations.RunSQL:
    return migrations.RunSQL(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS vector_hnsw_{dim} "
        f"ON memories_vector USING hnsw ((embedding::vector({dim})) vector_cosine_ops) "
        f"WITH (m = 16, ef_construction = 64) WHERE dimensions = {dim}",
        f"DROP INDEX CONCURRENTLY IF EXISTS vector_hnsw_{dim}",
    )


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0005_covering_index_with_id")]

    operations = [_hnsw(dim) for dim in INDEXED_DIMENSIONS]
