"""Chunks of a session in order: (base, session, source timestamp, id).

Replaces the (base, session) index, a prefix of this one, so writes maintain no extra
index. Hybrid search reads a hit's previous and next chunk through it (fusion.py).
Built concurrently, outside a transaction: the table stays writable meanwhile.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0009_bm25_term_statistics")]

    operations = [
        AddIndexConcurrently(
            model_name="chunk",
            index=models.Index(
                fields=["knowledge_base", "session_id", "source_timestamp", "id"],
                name="chunk_kb_session_order",
            ),
        ),
        RemoveIndexConcurrently(model_name="chunk", name="chunk_kb_session"),
    ]
