"""Erasures are recorded once, in the audit trail of access (``core.AccessEvent``,
action ``erasure``): core 0012 has copied this table's records there; it goes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0020_owner_in_covering_indexes"),
        ("core", "0012_scope_erasures_to_access_events"),
    ]

    operations = [migrations.DeleteModel(name="ScopeErasure")]
