"""An ``owner_id`` on the facts' links and changes (from their scope) and on the 16-bit
copies (from their fact), filled by a trigger on every insert
(``core.row_security.owner_column_sql``): row-level security's column."""

from django.db import migrations

from core.row_security import owner_column

# (table, the parent it gets its owner from, the column naming the parent)
TABLES = [
    ("memories_factlink", "memories_scope", "scope_id"),
    ("memories_factchange", "memories_scope", "scope_id"),
    ("memories_fact_half", "memories_fact", "id"),
]


class Migration(migrations.Migration):
    dependencies = [("memories", "0018_scope_erasure"),]

    operations = [owner_column(table, parent=parent, via=via) for table, parent, via in TABLES]
