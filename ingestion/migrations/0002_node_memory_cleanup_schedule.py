"""Register the daily node-memory cleanup with django-q2, idempotently (by name)."""

from django.db import migrations

NAME = "node-memory-cleanup"


def register(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={
            "func": "ingestion.tasks.node_memory_cleanup",
            "schedule_type": "D",  # Schedule.DAILY
            "repeats": -1,
        },
    )


def unregister(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("ingestion", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(register, unregister)]
