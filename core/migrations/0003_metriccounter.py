"""The counters behind ``/metrics`` move here from the facts room (``memories``
0011): their table is renamed in place (``memories_metriccounter`` ->
``core_metriccounter``, every row kept), its content type follows (with the
permissions that point at it), and the counters named after code that is gone are
renamed for what counts them now:

- ``memory_llm_calls_total`` -> ``engine_llm_calls_total`` (the extraction's and the
  dreams' LLM calls), ``memory_llm_tokens_total`` -> ``engine_llm_tokens_total``,
  ``memory_llm_malformed_total`` -> ``engine_llm_malformed_total``;
- ``memory_formation_runs_total`` (the per-message formation, removed) is added into
  ``engine_update_runs_total`` (the debounced update runs that replaced it).
"""

from django.db import migrations, models

RENAMES = {
    "memory_llm_calls_total": "engine_llm_calls_total",
    "memory_llm_tokens_total": "engine_llm_tokens_total",
    "memory_llm_malformed_total": "engine_llm_malformed_total",
    "memory_formation_runs_total": "engine_update_runs_total",
}

TABLE = "ALTER TABLE memories_metriccounter RENAME TO core_metriccounter"
TABLE_BACK = "ALTER TABLE core_metriccounter RENAME TO memories_metriccounter"
CONTENT_TYPE = (
    "UPDATE django_content_type SET app_label = %s WHERE app_label = %s "
    "AND model = 'metriccounter' AND NOT EXISTS (SELECT 1 FROM django_content_type "
    "WHERE app_label = %s AND model = 'metriccounter')"
)
# One counter into another: the value added, the old row gone (its name is not read).
RENAME = (
    "INSERT INTO core_metriccounter (name, value) SELECT %s, value FROM core_metriccounter "
    "WHERE name = %s ON CONFLICT (name) DO UPDATE SET value = core_metriccounter.value "
    "+ excluded.value"
)


def forward(apps, schema_editor):
    schema_editor.execute(CONTENT_TYPE, ["core", "memories", "core"])
    for old, new in RENAMES.items():
        schema_editor.execute(RENAME, [new, old])
        schema_editor.execute("DELETE FROM core_metriccounter WHERE name = %s", [old])


def backward(apps, schema_editor):
    schema_editor.execute(CONTENT_TYPE, ["memories", "core", "memories"])


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0002_extensions"),
        ("memories", "0011_metriccounter_to_core"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="MetricCounter",
                    fields=[
                        ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                        ("value", models.BigIntegerField(default=0)),
                    ],
                ),
            ],
            database_operations=[migrations.RunSQL(TABLE, TABLE_BACK)],
        ),
        migrations.RunPython(forward, backward),
    ]
