"""The owner in every unique key of the knowledge tables (``docs/scaling.md``: a table
distributed by owner accepts no other): the chunks' source key, and the primary keys
of the keyword statistics (``core.row_security.owner_in_unique``).

The statistics' trigger function names its conflict targets by constraint first, so
that it holds before and after the keys change (the constraints keep their names)."""

from django.db import migrations

from core.row_security import owner_in_unique

# What the statistics' function said, and what it says now.
TARGETS = [
    ("ON CONFLICT (knowledge_base_id, lexeme)", "ON CONFLICT ON CONSTRAINT knowledge_term_stats_pkey"),
    ("ON CONFLICT (knowledge_base_id)", "ON CONFLICT ON CONSTRAINT knowledge_base_text_stats_pkey"),
]


def _rewrite(pairs: list[tuple[str, str]]) -> str:
    replaced = "d := replace(d, %s, %s);"
    steps = "\n".join(
        f"IF position('{old}' IN d) = 0 THEN RAISE EXCEPTION 'not in knowledge_chunk_stats: {old}'; END IF;\n"
        + replaced % (f"'{old}'", f"'{new}'")
        for old, new in pairs
    )
    return f"""
DO $do$
DECLARE d text := pg_get_functiondef('knowledge_chunk_stats()'::regprocedure);
BEGIN
{steps}
EXECUTE d;
END $do$;
"""


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0016_owner_in_covering_indexes")]

    operations = [
        migrations.RunSQL(_rewrite(TARGETS), _rewrite([(new, old) for old, new in TARGETS])),
        *owner_in_unique(
            "chunk_unique_source_key", "knowledge_chunk", "knowledge_base_id, source_key"
        ),
        *owner_in_unique(
            "knowledge_term_stats_pkey",
            "knowledge_term_stats",
            "knowledge_base_id, lexeme",
            kind="primary",
        ),
        *owner_in_unique(
            "knowledge_base_text_stats_pkey",
            "knowledge_base_text_stats",
            "knowledge_base_id",
            kind="primary",
        ),
    ]
