"""``MetricCounter`` moves to the platform (``core``, which renders ``/metrics``): it
leaves this app's state here; ``core`` 0003 takes its table (renamed, rows kept)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("memories", "0010_scope_text_stats")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="MetricCounter")],
            database_operations=[],
        ),
    ]
