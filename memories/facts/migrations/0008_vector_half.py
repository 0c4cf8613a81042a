"""A 16-bit copy of each scoped fact's vector, in scope order (``memories_vector_half``),
and the fact table's scope index without the 32-bit vector.

Why: an exact ranking of a scope read its range of ``vector_scope_covering``, which
held the 32-bit vector (1.5 kB at 384 dimensions, three index tuples a page): 10,000
facts among 1M read 3,300 buffers, most of a 10 ms search. And a btree tuple cannot
pass 2,704 bytes, so a fact of 768 or more dimensions could not be stored at all
("index row size exceeds btree maximum"). Now:

- ``memories_vector_half``: per fact with a scope and at most 1,024 dimensions, the
  columns ranking reads and ``half``, its vector normalised to length 1 and stored as
  ``halfvec`` (a cosine does not depend on length; normalised, no component can
  overflow 16 bits). Its index ``memories_vector_half_scope`` (``(scope_id) INCLUDE
  (...)``) is a scope's range with half the pages; new facts append to their scope's
  run (equal keys are ordered by the row's place in the table). Searches rank the
  copies and re-rank the candidates within the 16-bit error's margin from the 32-bit
  vectors (``memories.personal.selectors._exact_ctes``): the ranking of an exact scan.
- Statement-level triggers on ``memories_vector`` keep the copies in the fact write's
  own transaction, whatever code path wrote (the ORM, a COPY, a cascade), as knowledge
  0009 keeps its term statistics. No foreign key: a TRUNCATE of the facts (Django's
  test flush) empties the copies through its own trigger.
- ``vector_scope_covering`` becomes a plain ``vector_scope`` index (the scope's foreign
  key; the exact scans of vectors without a copy), built concurrently before the old
  one is dropped concurrently.
- ``memories_vector``: ``STORAGE MAIN`` and ``toast_tuple_target = 8160`` (as knowledge
  0004 did for chunks), so a fact with a few hundred characters of text keeps its
  vector in its row instead of in TOAST, where each re-ranked candidate would pay a
  lookup. Rows written before stay as they are until rewritten; both work.

Safe on a large table: no rewrite of the fact table, no long lock. Existing facts are
copied in batches of 5,000 (each its own transaction; the rows are read ``FOR SHARE``,
so a concurrent update of one waits for the batch, and its trigger then replaces the
copy), then the scope index is built (sorted: full pages) and the copies vacuumed
(index-only scans need their visibility map). 1,010,500 facts took 76 s (BENCHMARKS.md,
"Memory engine, fourth pass"). On pgvector < 0.7 (no ``halfvec``) no copy is made and
searches scan the fact table (``selectors._half_table``).
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models, transaction

from core.hnsw import supports_halfvec
from core.triggers import copy_in_batches, half_copies_sql, statement_triggers

HALF_MAX_DIMENSIONS = 1024  # (selectors.HALF_MAX_DIMENSIONS: 2 kB of halfvec in a btree tuple)
BATCH = 5000

COLUMNS = "scope_id, id, dimensions, embedding_model, observed_at, confidence, category"

TRIGGERS, DROP_TRIGGERS = statement_triggers(
    table="memories_vector", prefix="memories_vector_half", old="vector_old", new="vector_new",
    functions=dict.fromkeys(["insert", "update", "delete", "truncate"], "memories_vector_half_sync"),
)  # fmt: skip

CREATE = """
CREATE TABLE memories_vector_half (
    id uuid PRIMARY KEY,
    scope_id bigint NOT NULL,
    dimensions smallint NOT NULL,
    embedding_model varchar(200) NOT NULL,
    observed_at timestamptz NOT NULL,
    confidence double precision NOT NULL,
    category varchar(16) NOT NULL,
    half halfvec NOT NULL
) WITH (toast_tuple_target = 8160);
-- (plain: never compressed, in the table or its index; 0023 does it for copies made before)
ALTER TABLE memories_vector_half ALTER COLUMN half SET STORAGE PLAIN;
"""

SYNC, COPY = half_copies_sql(
    table="memories_vector", copies="memories_vector_half", function="memories_vector_half_sync",
    columns=COLUMNS, keep=f"scope_id IS NOT NULL AND dimensions <= {HALF_MAX_DIMENSIONS}",
    old="vector_old", new="vector_new",
)  # fmt: skip

SCOPE_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS memories_vector_half_scope "
    "ON memories_vector_half (scope_id) INCLUDE "
    "(id, dimensions, embedding_model, observed_at, confidence, category, half)"
)

DROP = DROP_TRIGGERS + "DROP TABLE IF EXISTS memories_vector_half;"

INLINE = (
    "ALTER TABLE memories_vector ALTER COLUMN embedding SET STORAGE MAIN, "
    "SET (toast_tuple_target = 8160)"
)
OUTLINE = (
    "ALTER TABLE memories_vector ALTER COLUMN embedding SET STORAGE EXTERNAL, "
    "RESET (toast_tuple_target)"
)


def forward(apps, schema_editor):
    schema_editor.execute(INLINE)
    if not supports_halfvec(schema_editor):
        return
    with transaction.atomic(using=schema_editor.connection.alias):
        schema_editor.execute(CREATE + SYNC + TRIGGERS)
    copy_in_batches(
        schema_editor,
        table="memories_vector",
        first="00000000-0000-0000-0000-000000000000",
        copy_sql=COPY,
        batch=BATCH,
    )
    # Built once the copies are in (sorted, its pages full); new facts then append to
    # their scope's run (equal keys are ordered by the row's place in the table).
    schema_editor.execute(SCOPE_INDEX)
    schema_editor.execute("VACUUM (ANALYZE) memories_vector_half")


def backward(apps, schema_editor):
    schema_editor.execute(DROP)
    schema_editor.execute(OUTLINE)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0007_vector_hnsw_halfvec")]

    operations = [
        migrations.RunPython(forward, backward, atomic=False),
        AddIndexConcurrently(
            model_name="vector", index=models.Index(fields=["scope"], name="vector_scope")
        ),
        RemoveIndexConcurrently(model_name="vector", name="vector_scope_covering"),
    ]
