"""A 16-bit copy of each chunk's vector, in (base, session) order: ``knowledge_chunk_half``.

Why: at a million chunks an exact ranking of a slice of a large base (a session's 15,000
chunks, a small base among many) read each chunk's heap row for its vector, 2.7 kB a
row, and a filtered HNSW walk of the whole table for a slice of 1.5% of it took 30 ms at
the median and 125-240 ms at the 95th percentile (BENCHMARKS.md, "A million chunks
again"). The facts solved the same with ``memories_fact_half`` (memories 0008); chunks
now have the same:

- ``knowledge_chunk_half``: per chunk of at most 1,024 dimensions, the columns an exact
  ranking of a (base, session, time range) scope reads and ``half``, the vector
  normalised to length 1 and stored as ``halfvec``. Its index
  ``knowledge_chunk_half_scope`` (``(knowledge_base_id, session_id) INCLUDE (...)``)
  holds a base's or a session's range with a third of the pages of the heap rows.
  Searches rank the copies and re-rank the candidates within the 16-bit error's margin
  from the 32-bit vectors (``knowledge.retrieval.vectors._exact``): the ranking of an
  exact scan.
- Statement-level triggers on ``knowledge_chunk`` keep the copies in the chunk write's
  own transaction, whatever wrote (the ORM, a COPY, a cascade from its base), as 0009
  keeps the term statistics. The owner is copied from the chunk (row-level security's
  column; the key holds it, as every key of a table distributed by owner must).

Safe on a large table: no rewrite of the chunk table, no long lock. Existing chunks are
copied in batches of 5,000 (each its own transaction; the rows are read ``FOR SHARE``,
so a concurrent update of one waits for the batch, and its trigger then replaces the
copy), then the scope index is built (sorted: full pages) and the copies vacuumed
(index-only scans need their visibility map). On pgvector < 0.7 (no ``halfvec``) no
copy is made and searches scan the chunk table.
"""

from django.db import migrations, transaction

from core.hnsw import supports_halfvec
from core.triggers import copy_in_batches, half_copies_sql, statement_triggers

HALF_MAX_DIMENSIONS = 1024  # (2 kB of halfvec in a btree tuple)
BATCH = 5000

COLUMNS = "id, owner_id, knowledge_base_id, session_id, dimensions, source_timestamp, created_at"

TRIGGERS, DROP_TRIGGERS = statement_triggers(
    table="knowledge_chunk", prefix="knowledge_chunk_half", old="chunk_old", new="chunk_new",
    functions=dict.fromkeys(["insert", "update", "delete", "truncate"], "knowledge_chunk_half_sync"),
)  # fmt: skip

CREATE = """
CREATE TABLE knowledge_chunk_half (
    id bigint NOT NULL,
    owner_id integer NOT NULL,
    knowledge_base_id uuid NOT NULL,
    session_id varchar(255) NOT NULL,
    dimensions smallint NOT NULL,
    source_timestamp timestamptz,
    created_at timestamptz NOT NULL,
    half halfvec NOT NULL,
    PRIMARY KEY (id, owner_id)
) WITH (toast_tuple_target = 8160);
-- (plain: never compressed, in the table or its index; 0020 does it for copies made before)
ALTER TABLE knowledge_chunk_half ALTER COLUMN half SET STORAGE PLAIN;
"""

SYNC, COPY = half_copies_sql(
    table="knowledge_chunk", copies="knowledge_chunk_half", function="knowledge_chunk_half_sync",
    columns=COLUMNS, keep=f"dimensions <= {HALF_MAX_DIMENSIONS}", old="chunk_old",
    new="chunk_new", key=("id", "owner_id"),
)  # fmt: skip

SCOPE_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS knowledge_chunk_half_scope "
    "ON knowledge_chunk_half (knowledge_base_id, session_id) INCLUDE "
    "(id, dimensions, source_timestamp, created_at, half, owner_id)"
)

DROP = DROP_TRIGGERS + "DROP TABLE IF EXISTS knowledge_chunk_half;"


def forward(apps, schema_editor):
    if not supports_halfvec(schema_editor):
        return
    alias = schema_editor.connection.alias
    with transaction.atomic(using=alias):
        schema_editor.execute(CREATE + SYNC + TRIGGERS)
    copy_in_batches(schema_editor, table="knowledge_chunk", first=0, copy_sql=COPY, batch=BATCH)
    # Built once the copies are in (sorted, its pages full); new chunks then append to
    # their (base, session)'s run.
    schema_editor.execute(SCOPE_INDEX)
    schema_editor.execute("VACUUM (ANALYZE) knowledge_chunk_half")


def backward(apps, schema_editor):
    schema_editor.execute(DROP)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0017_owner_in_unique_keys")]

    operations = [migrations.RunPython(forward, backward, atomic=False)]
