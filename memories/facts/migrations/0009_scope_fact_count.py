"""Each scope's number of linked facts on its row (``memories_enduser.fact_count``).

A search chooses between walking the HNSW index and ranking the scope exactly by the
scope's size; it counted the scope's links for that, up to 20,001 of them (0.6 ms for
a scope of 10,000 facts). Now one row read. Statement-level triggers on
``memories_uservector`` keep the count in the link write's own transaction, whatever
code path wrote (as knowledge 0009 keeps its term statistics): the rows of the scopes
a statement touched are locked in id order, then updated once each. The column lives in
the table, not in the model, so Django never writes it (``EndUser.save`` would write
back a count read earlier).

Safe on a large table: the column is added without a rewrite; the triggers and the
count of the links already there are made in one transaction, during which links
cannot be written (the trigger's lock), for about as long as counting them takes
(1M links: see BENCHMARKS.md, "Memory engine, fourth pass").
"""

from django.db import migrations

from core.triggers import statement_triggers

OPS = ("insert", "update", "delete", "truncate")

TRIGGERS, DROP_TRIGGERS = statement_triggers(
    table="memories_uservector", prefix="memories_uservector_count", old="links_old",
    new="links_new", functions={op: f"memories_uservector_count_{op}" for op in OPS},
)  # fmt: skip


def _count(op: str) -> str:
    """The trigger function for one operation (each names its own transition tables)."""
    changed = {
        "insert": "SELECT end_user_id, 1 AS n FROM links_new",
        "delete": "SELECT end_user_id, -1 AS n FROM links_old",
        "update": "SELECT end_user_id, 1 AS n FROM links_new "
        "UNION ALL SELECT end_user_id, -1 FROM links_old",
    }[op]
    delta = (
        f"SELECT end_user_id, sum(n) AS n FROM ({changed}) c "
        "GROUP BY end_user_id HAVING sum(n) <> 0"
    )
    return f"""
CREATE FUNCTION memories_uservector_count_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The scopes' rows in id order first: two statements touching the same scopes
    -- queue instead of deadlocking.
    PERFORM 1 FROM memories_enduser WHERE id IN (SELECT end_user_id FROM ({delta}) d)
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE memories_enduser e SET fact_count = e.fact_count + d.n FROM ({delta}) d
    WHERE e.id = d.end_user_id;
    RETURN NULL;
END $$;
"""


CREATE = f"""
CREATE FUNCTION memories_uservector_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE memories_enduser SET fact_count = 0 WHERE fact_count <> 0;
    RETURN NULL;
END $$;
{_count("insert")}
{_count("delete")}
{_count("update")}
{TRIGGERS}
-- The links already there (the triggers' lock holds link writes until this commits).
UPDATE memories_enduser e SET fact_count = c.n
FROM (SELECT end_user_id, count(*) AS n FROM memories_uservector GROUP BY end_user_id) c
WHERE e.id = c.end_user_id;
"""

DROP = DROP_TRIGGERS + "ALTER TABLE memories_enduser DROP COLUMN IF EXISTS fact_count;"


class Migration(migrations.Migration):
    dependencies = [("memories", "0008_vector_half")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE memories_enduser ADD COLUMN fact_count bigint NOT NULL DEFAULT 0 "
            "CONSTRAINT enduser_fact_count_not_negative CHECK (fact_count >= 0);" + CREATE,
            DROP,
        )
    ]
