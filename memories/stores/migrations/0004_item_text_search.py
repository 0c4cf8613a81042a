"""Store items get the keyword leg chunks and facts have (BM25, ``knowledge.retrieval``).

- ``search_vector``: a stored generated tsvector of ``content_summary`` (English) plus one
  lexeme naming the item's store (``~store:<id>``, a lexeme no text can give), so a
  store's keyword matches are one GIN lookup, however many items other stores hold.
- ``memory_stores_memorystore.item_count`` and ``text_lexemes``: each store's number of
  items and the sum of their lengths in distinct lexemes of the text (the store's own
  lexeme left out): the N and mean length BM25 needs, and the store's size the vector leg
  chooses its path by. Statement-level triggers on the items keep both in the write's own
  transaction, whatever code path wrote (as the facts' counters, memories 0010). The
  columns live in the tables, not in the models, so Django never writes them.

Adding the generated column rewrites the item table (a few seconds per 100,000 items,
the table locked); the GIN index is then built concurrently.
"""

from django.db import migrations, transaction

from core.triggers import statement_triggers

OPS = ("insert", "update", "delete", "truncate")

TRIGGERS, DROP_TRIGGERS = statement_triggers(
    table="memory_stores_memoryitem", prefix="memoryitem_store_stats", old="items_old",
    new="items_new", functions={op: f"memoryitem_store_stats_{op}" for op in OPS},
)  # fmt: skip

COLUMN = """
ALTER TABLE memory_stores_memoryitem ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
    to_tsvector('english'::regconfig, content_summary)
    || array_to_tsvector(ARRAY['~store:' || store_id::text])
) STORED
"""
INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS memoryitem_search_vector_gin "
    "ON memory_stores_memoryitem USING gin (search_vector)"
)
COUNTERS = """
ALTER TABLE memory_stores_memorystore
    ADD COLUMN item_count bigint NOT NULL DEFAULT 0
        CONSTRAINT memorystore_item_count_not_negative CHECK (item_count >= 0),
    ADD COLUMN text_lexemes bigint NOT NULL DEFAULT 0
        CONSTRAINT memorystore_text_lexemes_not_negative CHECK (text_lexemes >= 0)
"""
_ROWS = "SELECT store_id, {sign} AS n, {sign} * (length(search_vector) - 1) AS l FROM {table}"


def _stats(op: str) -> str:
    changed = {
        "insert": _ROWS.format(sign=1, table="items_new"),
        "delete": _ROWS.format(sign=-1, table="items_old"),
        "update": _ROWS.format(sign=1, table="items_new")
        + " UNION ALL "
        + _ROWS.format(sign=-1, table="items_old"),
    }[op]
    delta = (
        f"SELECT store_id, sum(n) AS n, sum(l) AS l FROM ({changed}) c "
        "GROUP BY store_id HAVING sum(n) <> 0 OR sum(l) <> 0"
    )
    return f"""
CREATE FUNCTION memoryitem_store_stats_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The stores' rows in id order first: two statements touching the same stores
    -- queue instead of deadlocking.
    PERFORM 1 FROM memory_stores_memorystore WHERE id IN (SELECT store_id FROM ({delta}) d)
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE memory_stores_memorystore s
    SET item_count = s.item_count + d.n, text_lexemes = s.text_lexemes + d.l
    FROM ({delta}) d WHERE s.id = d.store_id;
    RETURN NULL;
END $$;
"""


CREATE = f"""
CREATE FUNCTION memoryitem_store_stats_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE memory_stores_memorystore SET item_count = 0, text_lexemes = 0
    WHERE item_count <> 0 OR text_lexemes <> 0;
    RETURN NULL;
END $$;
{_stats("insert")}
{_stats("delete")}
{_stats("update")}
{TRIGGERS}
-- The items already there (the triggers' lock holds item writes until this commits).
UPDATE memory_stores_memorystore s SET item_count = c.n, text_lexemes = c.l
FROM (SELECT store_id, count(*) AS n, sum(length(search_vector) - 1) AS l
      FROM memory_stores_memoryitem GROUP BY store_id) c
WHERE s.id = c.store_id;
"""


def forward(apps, schema_editor):
    schema_editor.execute(COLUMN)
    schema_editor.execute(INDEX)
    schema_editor.execute(COUNTERS)
    with transaction.atomic(using=schema_editor.connection.alias):
        schema_editor.execute(CREATE)


def backward(apps, schema_editor):
    schema_editor.execute(DROP_TRIGGERS)
    schema_editor.execute(
        "ALTER TABLE memory_stores_memorystore DROP COLUMN IF EXISTS item_count, "
        "DROP COLUMN IF EXISTS text_lexemes"
    )
    schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS memoryitem_search_vector_gin")
    schema_editor.execute(
        "ALTER TABLE memory_stores_memoryitem DROP COLUMN IF EXISTS search_vector"
    )


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory_stores", "0003_item_hnsw_halfvec")]

    operations = [migrations.RunPython(forward, backward, atomic=False)]
