"""Ingest job attempts, and the 5-minute sweep that resumes abandoned jobs."""

from django.db import migrations, models

NAME = "ingest-jobs-sweep"


def register(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name=NAME,
        defaults={
            "func": "knowledge.tasks.ingest_jobs_sweep",
            "schedule_type": "I",  # Schedule.MINUTES
            "minutes": 5,
            "repeats": -1,
        },
    )


def unregister(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("knowledge", "0006_ingest_job"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [
        migrations.AddField(
            model_name="ingestjob",
            name="attempts",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.RunPython(register, unregister),
    ]
