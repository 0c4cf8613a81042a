"""Django's ``flush``, connected as the tables' owner (core.management.table_owner);
when it emptied the tables and reset their sequences, the rooms that keep files under
owner ids delete them (``core.erasure.everything_flushed``): the next owner of id 1
would otherwise read the journal of the last one."""

from typing import Any

from django.core.management.commands.flush import Command as DjangoCommand
from django.db import DEFAULT_DB_ALIAS, connections

from core.erasure import everything_flushed
from core.management.table_owner import as_table_owner

PROMPT = """You have requested a flush of the database.
This will IRREVERSIBLY DESTROY all data currently in the "%s" database,
and return each table to an empty state, and delete the files kept under owner ids.
Are you sure you want to do this?

    Type 'yes' to continue, or 'no' to cancel: """


class Command(as_table_owner(DjangoCommand, secure=False)):  # type: ignore[misc]
    def handle(self, *args: Any, **options: Any) -> Any:
        if options.get("interactive"):  # (asked here: Django's own answer is not told)
            name = connections[options.get("database") or DEFAULT_DB_ALIAS].settings_dict["NAME"]
            if input(PROMPT % name) != "yes":
                self.stdout.write("Flush cancelled.")
                return None
            options["interactive"] = False
        result = super().handle(*args, **options)
        if options.get("reset_sequences", True):
            everything_flushed.send(sender=Command)
        return result
