"""An ``owner_id`` on a store's items and attachments, from their store, filled by a
trigger on every insert (``core.row_security.owner_column_sql``): row-level security's
column."""

from django.db import migrations

from core.row_security import owner_column

# (table, the parent it gets its owner from, the column naming the parent)
TABLES = [
    ("memory_stores_memoryitem", "memory_stores_memorystore", "store_id"),
    ("memory_stores_memoryattachment", "memory_stores_memorystore", "store_id"),
]


class Migration(migrations.Migration):
    dependencies = [("memory_stores", "0005_restrict_with_owner"),]

    operations = [owner_column(table, parent=parent, via=via) for table, parent, via in TABLES]
