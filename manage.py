#!/usr/bin/env python
import os
import re
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
    from django.core.management import execute_from_command_line

    from core import embedded_pg, tenancy
    from memoryproject.env import EnvError

    tenancy.for_command(sys.argv)  # whose rows the command may touch
    embedded_pg.for_command(sys.argv)  # whether it may create a missing embedded database
    try:
        execute_from_command_line(sys.argv)
    except EnvError as exc:  # a bad setting: one line naming it, not a traceback
        sys.exit(f"configuration error: {exc}")
    except Exception as exc:
        said = _operator_message(exc)
        if said is None or "--traceback" in sys.argv:
            raise
        sys.exit(said)


def _operator_message(exc: BaseException) -> str | None:
    """What an operator is told, in a line or a few, for a failure that is theirs to
    fix (the database down, the embedded server refusing a value) rather than a bug:
    None for anything else, which keeps its traceback."""
    from django.db import OperationalError, ProgrammingError

    from core.embedded_pg import EmbeddedPostgresError

    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    cause: BaseException | None = exc  # (a missing database: Django's OperationalError,
    while cause is not None:  # from core.db_backend's DatabaseMissing, from embedded_pg's)
        if isinstance(cause, EmbeddedPostgresError):
            return f"embedded database error: {text}"
        cause = cause.__cause__
    if isinstance(exc, OperationalError) and first.startswith(
        ("connection failed", "connection to server", "failed to resolve host")
    ):
        hint = (" (is the server running? DATABASE_URL)" if "Connection refused" in text
                else " (DATABASE_URL's host)" if "resolve host" in first else " (DATABASE_URL)")  # fmt: skip
        return f"database connection failed: {first.removeprefix('connection failed: ')}{hint}"
    role = re.fullmatch(r'role "([^"]+)" does not exist', first)
    if isinstance(exc, ProgrammingError) and role:  # (migrate grants to the service's role)
        return (
            f"database error: the service's role {role[1]!r} does not exist: make it first "
            "(manage.py ensure_service_role, as a role that may create roles; "
            "docs/operations.md, 'Row-level security')"
        )
    return None


if __name__ == "__main__":
    main()
