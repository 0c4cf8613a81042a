"""Was: register the daily node-memory cleanup schedule. Now a no-op (see core.schedules)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("ingestion", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [
        # Schedules are registered by core.schedules after every migrate (post_migrate);
        # this step used to write one here and is kept, doing nothing, so the
        # migration graph of existing databases stays the same.
        migrations.RunPython(migrations.RunPython.noop, migrations.RunPython.noop),
    ]
