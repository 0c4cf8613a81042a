"""``ScopeJournal`` is a proxy of the facts room's scope model, which ``memories`` 0012
renames (``EndUser`` -> ``Scope``): the proxy leaves the state before the rename (a
proxy has no table: nothing changes in the database) and 0004 brings it back on the
renamed model."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("memory_engine", "0002_dream_files_written"),
        ("memories", "0011_metriccounter_to_core"),
    ]

    operations = [migrations.DeleteModel(name="ScopeJournal")]
