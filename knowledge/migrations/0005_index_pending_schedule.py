"""Was: register the periodic sweep of the background HNSW indexer. Now a no-op (core.schedules).

Ingestion queues the indexer after each commit; the sweep covers a queueing
that failed or a worker that died mid-run.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("knowledge", "0004_deferred_hnsw_inline_vectors"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [
        # Schedules are registered by core.schedules after every migrate (post_migrate);
        # this step used to write one here and is kept, doing nothing, so the
        # migration graph of existing databases stays the same.
        migrations.RunPython(migrations.RunPython.noop, migrations.RunPython.noop),
    ]
