"""Each scope's BM25 statistics on its row: ``memories_enduser.text_facts`` and
``text_lexemes``.

The engine's keyword leg ranks a scope's facts by BM25 (``memories.personal.selectors``,
``_keyword_ctes``), which needs the scope's number of facts (N) and their mean length.
The facts it ranks are those holding the scope's ``~scope:<id>`` lexeme, the rows whose
``scope_id`` is the scope (migration 0003), plus its few shared facts (counted by the
statement itself). Per scope: ``text_facts``, the facts with that ``scope_id``;
``text_lexemes``, the sum of their lengths in distinct lexemes of the content
(``length(search_vector) - 1``: the scope's own lexeme is not text). Document
frequencies need no table: every fact holding a query word is read to be scored, and
the statement counts them as it goes.

Statement-level triggers on ``memories_vector`` keep both in the fact write's own
transaction, whatever code path wrote (as 0009 keeps ``fact_count`` from the links:
that one counts links, these count the rows the keyword leg reads, so each is exact by
construction). An UPDATE that changes neither ``scope_id`` nor the text (a confidence,
``updated_at``) writes nothing; otherwise the rows of the scopes touched are locked in
id order, then updated once each. The columns live in the table, not in the model, so
Django never writes them.

Safe on a large table: the columns are added without a rewrite, in a transaction of
their own (the scope table is locked for a moment only); then the triggers and the
figures of the facts already there are made in one transaction, during which facts
cannot be written (the triggers' lock; searches go on), for about as long as one read
of the fact table takes (1M facts: see BENCHMARKS.md, "Memory engine, fifth pass").
"""

from django.db import migrations, transaction

from core.triggers import statement_triggers

OPS = ("insert", "update", "delete", "truncate")

TRIGGERS, DROP_TRIGGERS = statement_triggers(
    table="memories_vector", prefix="memories_vector_text_stats", old="facts_old",
    new="facts_new", functions={op: f"memories_vector_text_stats_{op}" for op in OPS},
)  # fmt: skip

_ROWS = "SELECT scope_id, {sign} AS n, {sign} * (length(search_vector) - 1) AS l FROM {table}"


def _stats(op: str) -> str:
    """The trigger function for one operation (each names its own transition tables)."""
    changed = {
        "insert": _ROWS.format(sign=1, table="facts_new"),
        "delete": _ROWS.format(sign=-1, table="facts_old"),
        "update": _ROWS.format(sign=1, table="facts_new")
        + " UNION ALL "
        + _ROWS.format(sign=-1, table="facts_old"),
    }[op]
    delta = (
        f"SELECT scope_id, sum(n) AS n, sum(l) AS l FROM ({changed}) c "
        "WHERE scope_id IS NOT NULL GROUP BY scope_id HAVING sum(n) <> 0 OR sum(l) <> 0"
    )
    return f"""
CREATE FUNCTION memories_vector_text_stats_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The scopes' rows in id order first: two statements touching the same scopes
    -- queue instead of deadlocking (the link triggers of 0009 lock them the same way).
    PERFORM 1 FROM memories_enduser WHERE id IN (SELECT scope_id FROM ({delta}) d)
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE memories_enduser e
    SET text_facts = e.text_facts + d.n, text_lexemes = e.text_lexemes + d.l
    FROM ({delta}) d WHERE e.id = d.scope_id;
    RETURN NULL;
END $$;
"""


COLUMNS = """
ALTER TABLE memories_enduser
    ADD COLUMN text_facts bigint NOT NULL DEFAULT 0
        CONSTRAINT enduser_text_facts_not_negative CHECK (text_facts >= 0),
    ADD COLUMN text_lexemes bigint NOT NULL DEFAULT 0
        CONSTRAINT enduser_text_lexemes_not_negative CHECK (text_lexemes >= 0)
"""

CREATE = f"""
CREATE FUNCTION memories_vector_text_stats_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE memories_enduser SET text_facts = 0, text_lexemes = 0
    WHERE text_facts <> 0 OR text_lexemes <> 0;
    RETURN NULL;
END $$;
{_stats("insert")}
{_stats("delete")}
{_stats("update")}
{TRIGGERS}
-- The facts already there (the triggers' lock holds fact writes until this commits).
UPDATE memories_enduser e SET text_facts = c.n, text_lexemes = c.l
FROM (SELECT scope_id, count(*) AS n, sum(length(search_vector) - 1) AS l
      FROM memories_vector WHERE scope_id IS NOT NULL GROUP BY scope_id) c
WHERE e.id = c.scope_id;
"""

DROP = DROP_TRIGGERS + (
    "ALTER TABLE memories_enduser DROP COLUMN IF EXISTS text_facts, "
    "DROP COLUMN IF EXISTS text_lexemes;"
)


def forward(apps, schema_editor):
    schema_editor.execute(COLUMNS)
    with transaction.atomic(using=schema_editor.connection.alias):
        schema_editor.execute(CREATE)


def backward(apps, schema_editor):
    schema_editor.execute(DROP)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0009_scope_fact_count")]

    operations = [migrations.RunPython(forward, backward, atomic=False)]
