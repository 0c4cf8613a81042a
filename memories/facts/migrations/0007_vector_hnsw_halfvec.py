"""The fact vectors' HNSW indexes on 16-bit floats (``halfvec``), built concurrently.

Half the size of 0006's: a large scope's vector leg and an add's duplicate check walk
half the pages and compute cheaper distances (memory stores measured 1.85 against 3.55
ms of server CPU per walk at the same recall: BENCHMARKS.md, "Memory stores"). The index
only ranks: searches hand back the exact distance of the stored 32-bit vectors. On
pgvector < 0.7 (no ``halfvec``) the 0006 indexes stay. To build them on a large table,
raise ``maintenance_work_mem`` first (README, "Core facts").
"""

from django.db import migrations

from core.hnsw import halfvec_swap
from knowledge.models import INDEXED_DIMENSIONS

forward, backward = halfvec_swap(
    table="memories_vector", prefix="vector_hnsw", dims=INDEXED_DIMENSIONS, ef_construction=64
)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0006_vector_hnsw")]

    operations = [migrations.RunPython(forward, backward, atomic=False)]
