"""Create the service's role on an external PostgreSQL, connected as the tables' owner.

With ``DATABASE_OWNER_URL`` set, ``DATABASE_URL`` names the role the service connects as
(row-level security holds for it) and ``DATABASE_OWNER_URL`` the tables' owner. This
creates the former when it does not exist yet: it logs in with ``DATABASE_URL``'s
password, is no superuser, creates no database or role, bypasses no row-level security
and owns nothing; ``migrate`` then grants it the tables. The owner needs ``CREATEROLE``
(the official image's ``POSTGRES_USER`` has it). A role that exists is left as it is (its
password included); without ``DATABASE_OWNER_URL`` there is nothing to do. The
embedded database makes its own (``core.embedded_pg``).

    python manage.py ensure_service_role && python manage.py migrate
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg import errors, sql

from core.db_backend.base import service_role, table_owner

_ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS"


class Command(BaseCommand):
    help = __doc__.split("\n\n")[0]
    # (no checks: they would connect as the role this may be about to create)
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] not in connections.settings:
            known = ", ".join(connections.settings)
            raise CommandError(f"--database: no database {options['database']!r} (known: {known})")
        connection = connections[options["database"]]
        password = connection.settings_dict.get("PASSWORD") or ""
        with table_owner(connection):
            role = service_role(connection)
            if role is None:
                self.stdout.write("no DATABASE_OWNER_URL: the service's role owns the tables")
                return
            connection.ensure_connection()
            raw = connection.connection
            with raw.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
                if cur.fetchone():
                    self.stdout.write(f"role {role} exists")
                    return
                statement = sql.SQL("CREATE ROLE {} " + _ATTRIBUTES).format(sql.Identifier(role))
                if password:
                    statement += sql.SQL(" PASSWORD {}").format(sql.Literal(password))
                try:
                    cur.execute(statement)
                except errors.DuplicateObject:  # (another host's, meanwhile)
                    self.stdout.write(f"role {role} exists")
                    return
                except errors.InsufficientPrivilege as exc:
                    raise CommandError(
                        f"the tables' owner may not create the role {role} ({exc}): create it "
                        "as docs/operations.md says (Row-level security)"
                    ) from exc
        self.stdout.write(f"role {role} created")  # (autocommit: made by the statement)
