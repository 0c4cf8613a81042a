"""One django-q2 schedule per debounced run's name (``engine-updates:<scope>``) and per
deferred Memory Base job (``memory-base-job:<job>``). Their writers ``update_or_create``
by name, which two requests at once could turn into two rows; the next write then failed
("get() returned more than one Schedule") and its chat turn never reached extraction.
With the index the second insert fails and ``update_or_create`` takes the row the first
made. Duplicates left by the race are merged first (the oldest row kept)."""

from django.db import migrations

NAMES = "(name LIKE 'engine-updates:%' OR name LIKE 'memory-base-job:%')"


class Migration(migrations.Migration):
    dependencies = [("core", "0009_ormq_lanes_index")]

    operations = [
        migrations.RunSQL(
            [
                "DELETE FROM django_q_schedule s USING django_q_schedule t WHERE s.name = t.name"
                f" AND s.id > t.id AND {NAMES.replace('name', 's.name')}",
                f"CREATE UNIQUE INDEX core_schedule_one_per_run ON django_q_schedule (name) WHERE {NAMES}",
            ],
            "DROP INDEX IF EXISTS core_schedule_one_per_run",
        ),
    ]
