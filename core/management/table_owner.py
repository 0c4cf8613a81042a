"""Django's commands that change the schema or empty tables, run as the tables' owner
(``core.db_backend.table_owner``): ``migrate``, ``createcachetable`` (then
``core.row_security.secure_tables``: policies and the service role's grants), ``flush``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connections

from core.db_backend.base import service_role, table_owner
from core.row_security import secure_tables


def as_table_owner(command: type[BaseCommand], *, secure: bool) -> type[BaseCommand]:
    class Command(command):  # type: ignore[valid-type,misc]
        def handle(self, *args: Any, **options: Any) -> Any:
            connection = connections[options.get("database") or DEFAULT_DB_ALIAS]
            with table_owner(connection):
                result = super().handle(*args, **options)
                if secure:
                    secure_tables(connection, service_role(connection))
            return result

    Command.__doc__ = command.__doc__
    return Command
