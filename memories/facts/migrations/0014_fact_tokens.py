"""``Fact.tokens``: the tokens of the fact's injection line (``- [category | confidence]
content``, tiktoken's ``cl100k_base``), counted once by the write service when it
writes the fact, where injection counted every fact on every call. The facts already
there are counted here, in batches of 2,000 (each its own transaction; a batch writes
only rows still as it read them, so a fact changed meanwhile keeps the count its
writer set). A fact left uncounted (NULL: written by something other than the write
service, a COPY) is counted by injection as before. Then the table is vacuumed: the
count rewrote every row, and searches would otherwise read the dead versions (and their
index entries) until autovacuum got to them.
"""

from django.db import migrations, models

from core.providers.tokens import count_tokens

BATCH = 2000
READ = (
    "SELECT id, content, category, confidence FROM memories_fact "
    "WHERE tokens IS NULL AND id > %s ORDER BY id LIMIT %s"
)
WRITE = (
    "UPDATE memories_fact f SET tokens = v.tokens FROM (SELECT unnest(%s::uuid[]) AS id, "
    "unnest(%s::text[]) AS content, unnest(%s::varchar[]) AS category, "
    "unnest(%s::float8[]) AS confidence, unnest(%s::int[]) AS tokens) v "
    "WHERE f.id = v.id AND f.content = v.content AND f.category = v.category "
    "AND f.confidence = v.confidence AND f.tokens IS NULL"
)


def _line(content: str, category: str, confidence: float) -> str:
    # (memories.facts.injection.fact_line as of this migration)
    return f"- [{category} | {confidence:.2f}] {content}"


def backfill(apps, schema_editor):
    from django.db import transaction

    alias = schema_editor.connection.alias
    last = "00000000-0000-0000-0000-000000000000"
    while True:
        with transaction.atomic(using=alias), schema_editor.connection.cursor() as cur:
            cur.execute(READ, [last, BATCH])
            rows = cur.fetchall()
            if not rows:
                break
            ids, contents, categories, confidences = (list(c) for c in zip(*rows))
            tokens = [count_tokens(_line(*row[1:])) for row in rows]
            cur.execute(WRITE, [ids, contents, categories, confidences, tokens])
            last = rows[-1][0]
    schema_editor.execute("VACUUM (ANALYZE) memories_fact")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0013_global_memories_scope")]

    operations = [
        migrations.AddField(
            model_name="fact",
            name="tokens",
            field=models.PositiveIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, atomic=False),
    ]
