"""Django's ``flush``, connected as the tables' owner (core.management.table_owner);
when it emptied the tables and reset their sequences, the rooms that keep files under
owner ids delete them (``core.erasure.everything_flushed``): the next owner of id 1
would otherwise read the journal of the last one."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.commands.flush import Command as DjangoCommand

from core.erasure import everything_flushed
from core.management.table_owner import as_table_owner


class Command(as_table_owner(DjangoCommand, secure=False)):  # type: ignore[misc]
    def handle(self, *args: Any, **options: Any) -> Any:
        result = super().handle(*args, **options)
        model = get_user_model()
        if (
            options.get("reset_sequences", True)
            and not model.objects.using(options.get("database") or "default").exists()
        ):  # (not a flush the operator declined)
            everything_flushed.send(sender=Command)
        return result
