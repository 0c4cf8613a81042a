"""Register the periodic sweep of the background HNSW indexer, idempotently (by name).

Ingestion queues the indexer after each commit; the sweep covers a queueing
that failed or a worker that died mid-run.
"""

from django.db import migrations

NAME = "index-pending-chunks"


def register(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={
            "func": "knowledge.tasks.index_pending_chunks",
            "schedule_type": "I",  # Schedule.MINUTES
            "minutes": 5,
            "repeats": -1,
        },
    )


def unregister(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("knowledge", "0004_deferred_hnsw_inline_vectors"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(register, unregister)]
