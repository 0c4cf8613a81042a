"""The items' HNSW indexes on 16-bit floats (``halfvec``), built concurrently.

An index of half the size: the graph walk of a search reads half the pages and
computes cheaper distances, and every insert costs less (BENCHMARKS.md, "Memory
stores"). The index only ranks: searches hand back (and order by) the exact distance of
the stored 32-bit vectors. ``ef_construction`` 100 (was 64) buys back the recall the
rounding costs, and more. On pgvector < 0.7 (no ``halfvec``) the 0002 indexes stay.
"""

from django.db import migrations

from knowledge.models import INDEXED_DIMENSIONS


def _supports_halfvec(schema_editor) -> bool:
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cur.fetchone()
    parts = [int(p) for p in (row[0] if row else "0").split(".")[:2] if p.isdigit()]
    return tuple(parts) >= (0, 7)


def halfvec_indexes(apps, schema_editor) -> None:
    if not _supports_halfvec(schema_editor):
        return
    for dim in INDEXED_DIMENSIONS:
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS memoryitem_hnsw_half_{dim} "
            f"ON memory_stores_memoryitem USING hnsw ((embedding::halfvec({dim})) "
            f"halfvec_cosine_ops) WITH (m = 16, ef_construction = 100) WHERE dimensions = {dim}"
        )
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS memoryitem_hnsw_{dim}")


def vector_indexes(apps, schema_editor) -> None:
    for dim in INDEXED_DIMENSIONS:
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS memoryitem_hnsw_{dim} "
            f"ON memory_stores_memoryitem USING hnsw ((embedding::vector({dim})) "
            f"vector_cosine_ops) WITH (m = 16, ef_construction = 64) WHERE dimensions = {dim}"
        )
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS memoryitem_hnsw_half_{dim}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory_stores", "0002_item_hnsw")]

    operations = [migrations.RunPython(halfvec_indexes, vector_indexes, atomic=False)]
