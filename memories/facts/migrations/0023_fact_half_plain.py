"""The facts' 16-bit copies (``memories_fact_half``, 0008) are stored as they are:
``half`` becomes ``STORAGE PLAIN`` and the scope index is rebuilt concurrently, so no
copy is compressed in it (``core.triggers.store_copies_plain`` says why).

Safe on a large table: no rewrite of the copies, no lock held past the catalogue update;
the index is rebuilt beside the old one while searches and writes go on.
"""

from django.db import migrations

from core.triggers import store_copies_plain


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0022_owner_in_factlink_key")]

    operations = [store_copies_plain(copies="memories_fact_half", index="memories_fact_half_scope")]
