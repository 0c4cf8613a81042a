"""The chunks' HNSW indexes on 16-bit floats (``halfvec``), built concurrently.

Half the size (112 MB against 195 MB for 100,000 384-dimension chunks): a search's
graph walk reads half the pages and computes cheaper distances. The index only ranks:
searches hand back (and order their candidates by) the exact distance of the stored
32-bit vectors (``knowledge.search._index_vector``). ``ef_construction`` 100 (was 64)
buys back the recall the rounding costs, as for the memory stores' items (memory_stores
0003). On pgvector < 0.7 (no ``halfvec``) the 0004 indexes stay. Like them, an index
covers the rows the background indexer has reached (``NOT index_pending``).
"""

from django.db import migrations

from knowledge.models import INDEXED_DIMENSIONS


def _supports_halfvec(schema_editor) -> bool:
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        version = (cur.fetchone() or ("0",))[0]
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) >= (0, 7)


def halfvec_index_sql(dim: int) -> str:
    return (
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_hnsw_half_{dim} "
        f"ON knowledge_chunk USING hnsw ((embedding::halfvec({dim})) halfvec_cosine_ops) "
        f"WITH (m = 16, ef_construction = 100) WHERE dimensions = {dim} AND NOT index_pending"
    )


def vector_index_sql(dim: int) -> str:
    return (
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_hnsw_{dim} "
        f"ON knowledge_chunk USING hnsw ((embedding::vector({dim})) vector_cosine_ops) "
        f"WITH (m = 16, ef_construction = 64) WHERE dimensions = {dim} AND NOT index_pending"
    )


def halfvec_indexes(apps, schema_editor) -> None:
    if not _supports_halfvec(schema_editor):
        return
    # Each new index is built before the old one goes, so searches keep an index.
    for dim in INDEXED_DIMENSIONS:
        schema_editor.execute(halfvec_index_sql(dim))
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS chunk_hnsw_{dim}")


def vector_indexes(apps, schema_editor) -> None:
    for dim in INDEXED_DIMENSIONS:
        schema_editor.execute(vector_index_sql(dim))
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS chunk_hnsw_half_{dim}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0010_session_order_index")]

    operations = [migrations.RunPython(halfvec_indexes, vector_indexes, atomic=False)]
