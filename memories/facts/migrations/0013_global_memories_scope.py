"""Global memories become the facts of each owner's global scope (the owner-level scope,
the empty path ``[]``), so the one search of facts ranks them as it ranks any scope's,
with the scope's own statistics: each owner with global memories gets that scope row,
each global memory its ``scope`` and its link (the triggers of 0008-0010 make its
16-bit copy and count it). Then ``Fact.type`` ("memory" or "global") says nothing the
scope does not: the column and its index go. Every row is kept; backward puts them back.
"""

from django.db import migrations, models

FORWARD = [
    "INSERT INTO memories_scope (owner_id, path, external_id, created_at) "
    "SELECT DISTINCT owner_id, '{}'::varchar(255)[], NULL::varchar, now() "
    "FROM memories_fact WHERE type = 'global' ON CONFLICT (owner_id, path) DO NOTHING",
    "UPDATE memories_fact f SET scope_id = s.id FROM memories_scope s "
    "WHERE f.type = 'global' AND s.owner_id = f.owner_id AND s.path = '{}'",
    "INSERT INTO memories_factlink (scope_id, fact_id, shared, created_at) "
    "SELECT scope_id, id, false, created_at FROM memories_fact WHERE type = 'global' "
    "ON CONFLICT DO NOTHING",
]
BACKWARD = [
    "UPDATE memories_fact f SET type = 'global', scope_id = NULL FROM memories_scope s "
    "WHERE f.scope_id = s.id AND s.path = '{}'",
    "DELETE FROM memories_factlink l USING memories_scope s "
    "WHERE l.scope_id = s.id AND s.path = '{}'",
    "DELETE FROM memories_scope WHERE path = '{}'",
]


def _run(statements):
    def run(apps, schema_editor):
        for sql in statements:
            schema_editor.execute(sql)
        # The deferred foreign-key checks now, not at the commit: the table is altered
        # next, which PostgreSQL refuses while it has pending trigger events.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")

    return run


class Migration(migrations.Migration):
    dependencies = [("memories", "0012_rename_facts")]

    operations = [
        migrations.RunPython(_run(FORWARD), _run(BACKWARD)),
        migrations.RemoveIndex(model_name="fact", name="fact_owner_type"),
        migrations.RemoveField(model_name="fact", name="type"),
    ]
