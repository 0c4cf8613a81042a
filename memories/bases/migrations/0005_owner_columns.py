"""An ``owner_id`` on a memory base's sessions and jobs, from their memory base, filled by
a trigger on every insert (``core.row_security.owner_column_sql``): row-level
security's column."""

from django.db import migrations

from core.row_security import owner_column

# (table, the parent it gets its owner from, the column naming the parent)
TABLES = [
    ("ingestion_memorybasesession", "ingestion_memorybase", "memory_base_id"),
    ("ingestion_ingestionjob", "ingestion_memorybase", "memory_base_id"),
]


class Migration(migrations.Migration):
    dependencies = [("memory_bases", "0004_memorybasejob_deferred_until"),]

    operations = [owner_column(table, parent=parent, via=via) for table, parent, via in TABLES]
