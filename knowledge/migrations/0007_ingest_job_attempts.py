"""Ingest job attempts (the sweep schedule it used to register is in core.schedules)."""

from django.db import migrations, models


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
        # Schedules are registered by core.schedules after every migrate (post_migrate);
        # this step used to write one here and is kept, doing nothing, so the
        # migration graph of existing databases stays the same.
        migrations.RunPython(migrations.RunPython.noop, migrations.RunPython.noop),
    ]
