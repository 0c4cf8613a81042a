"""The chunks' 16-bit copies (``knowledge_chunk_half``, 0018) are stored as they are:
``half`` becomes ``STORAGE PLAIN`` and the scope index is rebuilt concurrently, so no
copy is compressed in it (``core.triggers.store_copies_plain`` says why).

Safe on a large table: no rewrite of the copies, no lock held past the catalogue update;
the index is rebuilt beside the old one (about as long as 0018 took to build it) while
searches and writes go on.
"""

from django.db import migrations

from core.triggers import store_copies_plain


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0019_session_counts")]

    operations = [
        store_copies_plain(copies="knowledge_chunk_half", index="knowledge_chunk_half_scope")
    ]
