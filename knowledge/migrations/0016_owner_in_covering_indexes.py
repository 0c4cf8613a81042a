"""The chunks' indexes that searches read without the table (index-only scans: a
scope's rows counted by session, a hit's neighbours in its document) also cover
``owner_id``, the column row-level security's policy reads
(``core.row_security.owner_covering_sql``). Built concurrently: the table stays
writable."""

from django.db import migrations

from core.row_security import owner_covering_sql

INDEXES = [
    ("chunk_kb_session_order", "knowledge_base_id, session_id, source_timestamp, id"),
    ("chunk_kb_document_order", "knowledge_base_id, document_key, chunk_index, id"),
]


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("knowledge", "0015_owner_columns")]

    operations = [
        migrations.RunSQL(*owner_covering_sql(name, "knowledge_chunk", columns))
        for name, columns in INDEXES
    ]
