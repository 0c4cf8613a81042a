"""The broker's lanes (core.broker): the next lane's oldest task is one walk of an index
on (key, id) of django-q2's queue table."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0008_writeposition"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS core_ormq_lane_id ON django_q_ormq (key, id)",
            "DROP INDEX IF EXISTS core_ormq_lane_id",
        ),
    ]
