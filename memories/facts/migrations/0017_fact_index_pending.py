"""Facts a bulk import writes wait for the background indexer instead of paying for HNSW
insertion one row at a time (a few hundred rows a second): ``index_pending``, the
facts' HNSW indexes made partial (``NOT index_pending``), and a partial index of the
pending rows by scope, which searches rank exactly beside the index walk (as chunks,
knowledge 0004).

Each HNSW index is built again, concurrently, under a new name before the old one goes
(searches keep an index), then takes the old name. On a large table raise
``maintenance_work_mem`` first (docs/operations.md, upgrades).
"""

from typing import Any

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from knowledge.models import INDEXED_DIMENSIONS


def _rebuild(schema_editor: Any, predicate: str) -> None:
    with schema_editor.connection.cursor() as cur:
        for dim in INDEXED_DIMENSIONS:
            for kind, name in (("halfvec", f"fact_hnsw_half_{dim}"), ("vector", f"fact_hnsw_{dim}")):
                cur.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
                if not cur.fetchone()[0]:
                    continue
                cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}_new")
                cur.execute(
                    f"CREATE INDEX CONCURRENTLY {name}_new ON memories_fact USING hnsw "
                    f"((embedding::{kind}({dim})) {kind}_cosine_ops) WITH (m = 16, "
                    f"ef_construction = 64) WHERE dimensions = {dim}{predicate}"
                )
                cur.execute(f"DROP INDEX CONCURRENTLY {name}")
                cur.execute(f"ALTER INDEX {name}_new RENAME TO {name}")


def forward(apps: Any, schema_editor: Any) -> None:
    _rebuild(schema_editor, " AND NOT index_pending")


def backward(apps: Any, schema_editor: Any) -> None:
    _rebuild(schema_editor, "")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0016_fact_history")]

    operations = [
        migrations.AddField(
            model_name="fact",
            name="index_pending",
            field=models.BooleanField(default=False, db_default=False, editable=False),
        ),
        AddIndexConcurrently(
            model_name="fact",
            index=models.Index(
                condition=models.Q(("index_pending", True)),
                fields=["scope"],
                name="fact_scope_index_pending",
            ),
        ),
        migrations.RunPython(forward, backward, atomic=False),
    ]
