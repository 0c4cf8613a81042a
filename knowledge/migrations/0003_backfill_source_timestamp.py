"""Every chunk carries a source_timestamp since time filters use its index; chunks
written before that get their creation time (what the filters used to fall back to)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0002_search_indexes")]

    operations = [
        migrations.RunSQL(
            "UPDATE knowledge_chunk SET source_timestamp = created_at WHERE source_timestamp IS NULL",
            migrations.RunSQL.noop,
        ),
    ]
