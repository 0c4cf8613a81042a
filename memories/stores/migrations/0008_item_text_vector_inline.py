"""A store item's text vector (``search_vector``, 0004) stays in its row: ``STORAGE MAIN``.

Why: an item's row holds its 32-bit vector (1.5 kB at 384 dimensions), so PostgreSQL moved
the largest of its other columns out of line (TOAST), and that was the text vector, which
the keyword leg reads for every item it scores: a lookup in TOAST per item, 500 items per
search of a large store. With ``MAIN`` the snapshots and the summary, which a search reads
only for its hits, go out of line first. One store's keyword leg took 0.78 of its time
(BENCHMARKS.md, "The stores' 15 ms: copies stored plain, text vectors in line, one
walk").

Items written before keep their layout until they are rewritten; both are read the same.
No rewrite, no lock held past the catalogue update.
"""

from django.db import migrations

INLINE = "ALTER TABLE memory_stores_memoryitem ALTER COLUMN search_vector SET STORAGE MAIN"
OUT_OF_LINE = "ALTER TABLE memory_stores_memoryitem ALTER COLUMN search_vector SET STORAGE EXTENDED"


class Migration(migrations.Migration):
    dependencies = [("memory_stores", "0007_owner_in_unique_keys")]

    operations = [migrations.RunSQL(INLINE, OUT_OF_LINE)]
