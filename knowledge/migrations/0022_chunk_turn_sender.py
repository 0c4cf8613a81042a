"""``chunk_kb_turn_sender``: a conversation's turns by sender.

A search's speaker lift (``knowledge.search.query_names``) asks whether a capitalised word
of the query is the sender of a turn of the searched bases ("What did Ann say about the
launch?", turns sent by ``Ann``): one index lookup per spelling of the word, where
without it the base's every turn was read to answer no. (Row-level security keeps an
index on ``lower(sender)`` from serving the lookup: ``lower`` is not leakproof.)

Built concurrently: chunk writes go on meanwhile. A build that fails leaves an invalid
index, which ``IF NOT EXISTS`` would keep on a second run (and the lookups would read the
base's turns): drop it (``DROP INDEX CONCURRENTLY chunk_kb_turn_sender``) and migrate again.
"""

from django.db import migrations

INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS chunk_kb_turn_sender ON knowledge_chunk "
    "(knowledge_base_id, sender) WHERE session_id <> '' AND sender <> ''"
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("knowledge", "0021_bm25_term_sets")]

    operations = [
        migrations.RunSQL(INDEX, "DROP INDEX CONCURRENTLY IF EXISTS chunk_kb_turn_sender"),
    ]
