"""The owner in the facts' links' primary key (``docs/scaling.md``: a table distributed
by owner accepts no other key; ``core.row_security.owner_in_unique``). The model keeps
its key on (scope, fact): ``owner_id`` is not a field of it (a trigger fills it from the
scope), and follows from the scope: the same rows are refused."""

from django.db import migrations

from core.row_security import owner_in_unique


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0021_delete_scopeerasure")]

    operations = owner_in_unique(
        "memories_factlink_pkey", "memories_factlink", "scope_id, fact_id", kind="primary"
    )
