"""The facts' indexes that searches read without the table also cover ``owner_id``,
the column row-level security's policy reads (``core.row_security.owner_covering_sql``):
the 16-bit copies of a scope (its exact ranking reads them from the index alone) and a
scope's links. Built concurrently: the tables stay writable."""

from django.db import migrations

from core.row_security import owner_covering_sql

HALF_COVERS = "id, dimensions, embedding_model, observed_at, confidence, category, half"


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0019_owner_columns")]

    operations = [
        migrations.RunSQL(
            *owner_covering_sql("memories_fact_half_scope", "memories_fact_half", "scope_id", HALF_COVERS)
        ),
        # (a new one: the primary key, (scope_id, fact_id), cannot include a column)
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS factlink_scope_fact "
            "ON memories_factlink (scope_id, fact_id) INCLUDE (owner_id)",
            "DROP INDEX CONCURRENTLY IF EXISTS factlink_scope_fact",
        ),
    ]
