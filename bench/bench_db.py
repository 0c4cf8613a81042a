"""What the benches share about their database."""

from __future__ import annotations

from collections.abc import Callable

from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from core.db_backend.base import table_owner


def migrate_if_needed(log: Callable[[str], None] = print) -> None:
    """Apply the migrations the bench database lacks. Asked as the tables' owner: a
    database made before row-level security has granted the service's role nothing."""
    with table_owner(connection):
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if pending:
        log("applying migrations to the bench database ...")
        call_command("migrate", interactive=False, verbosity=0)


def as_operator(script: str) -> None:
    """Let the bench's own statements touch every owner's rows (``core.tenancy``), as a
    ``manage.py`` command's may: loading data, looking it up. What a bench measures runs
    so too, unless it runs in a request (an API call runs as its key's owner) or under
    ``tenancy.as_owner``: what the policies cost is ``bench_row_security.py``'s to say."""
    from pathlib import Path

    from core import tenancy

    tenancy.set_fallback(("", f"bench {Path(script).stem}"))


def connect_as_tables_owner() -> None:
    """Every connection of the process from now on (the split legs' threads' too) as the
    tables' owner, which row-level security exempts: for a paired run against an older
    search (c246bc8) that sends no owner settings, whose statements the policies would
    refuse. What the policies cost is ``bench_row_security.py``'s to say."""
    from django.db import DEFAULT_DB_ALIAS, connections

    entry = connections.settings[DEFAULT_DB_ALIAS]
    entry["USER"] = entry.get("OWNER_USER", entry["USER"])
    connections[DEFAULT_DB_ALIAS].close()
