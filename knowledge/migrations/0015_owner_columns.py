"""An ``owner_id`` on the tables whose owner was known only through their knowledge base:
the chunks, the ingest jobs and the keyword statistics (row-level security's column,
and the sharding column of ``docs/scaling.md``), filled from the base by a trigger on
every insert (``core.row_security.owner_column_sql``)."""

from django.db import migrations

from core.row_security import owner_column

# (table, the parent it gets its owner from, the column naming the parent)
TABLES = [
    ("knowledge_chunk", "knowledge_knowledgebase", "knowledge_base_id"),
    ("knowledge_ingestjob", "knowledge_knowledgebase", "knowledge_base_id"),
    ("knowledge_term_stats", "knowledge_knowledgebase", "knowledge_base_id"),
    ("knowledge_base_text_stats", "knowledge_knowledgebase", "knowledge_base_id"),
]


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0014_chunk_document_order"),]

    operations = [owner_column(table, parent=parent, via=via) for table, parent, via in TABLES]
