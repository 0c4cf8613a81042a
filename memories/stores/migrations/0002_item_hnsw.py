"""HNSW indexes over item vectors, one partial expression index per dimension (the
column has none, so stores of different models share the table), built concurrently."""

from django.db import migrations

from knowledge.models import INDEXED_DIMENSIONS


def _hnsw(dim: int) -> migrations.RunSQL:
    return migrations.RunSQL(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS memoryitem_hnsw_{dim} "
        f"ON memory_stores_memoryitem USING hnsw ((embedding::vector({dim})) vector_cosine_ops) "
        f"WITH (m = 16, ef_construction = 64) WHERE dimensions = {dim}",
        f"DROP INDEX CONCURRENTLY IF EXISTS memoryitem_hnsw_{dim}",
    )


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory_stores", "0001_initial")]

    operations = [_hnsw(dim) for dim in INDEXED_DIMENSIONS]
