from __future__ import annotations

import time
from typing import Any, cast

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.db_recovery import watch_embedded
from core.qcluster import QclusterProgram, run_cluster
from core.supervisor import Supervisor


class Command(BaseCommand):
    help = (
        "Run the django-q2 worker cluster under a supervisor: restarted with backoff if it "
        "exits, and as a whole (process group) if tasks wait while none finishes for "
        "WORKER_STALL_SECONDS; no process of it outlives this command. Use it instead of "
        "`qcluster` in production."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--run-cluster",
            action="store_true",
            help="Run the cluster itself in this process, unsupervised (what the supervisor "
            "starts).",
        )
        parser.add_argument(
            "--stall-seconds",
            type=float,
            default=None,
            help="Override WORKER_STALL_SECONDS.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        given = options["stall_seconds"]
        if given is not None and not given >= 1:  # (-5 restarted the cluster every 3 s)
            raise CommandError(f"--stall-seconds must be at least 1, got {given:g}")
        if options["run_cluster"]:
            run_cluster()
            return
        stall = given or settings.WORKER_STALL_SECONDS
        self._wait_for_migrations()
        supervisor = Supervisor([QclusterProgram(stall_seconds=stall)], periodic=[watch_embedded()])
        self.stdout.write(f"Supervising the worker cluster (stall limit {stall:.0f}s)")
        supervisor.run()
        self.stdout.write("Stopped.")

    def _wait_for_migrations(self, every: float = 2.0) -> None:
        """The worker does not migrate (operations.md): on a database not migrated yet
        it says so once and waits, rather than starting a cluster whose every process
        logs a traceback a second until ``migrate`` (or ``serve``, which migrates) ran.
        So on an embedded database not made yet (``core.embedded_pg.for_command``).
        A database it cannot reach at first is left to the cluster and the supervisor,
        as before."""
        from django.db import DatabaseError, connection
        from django.db.migrations.executor import MigrationExecutor

        from core.db_backend.base import DatabaseMissing
        from core.embedded_pg import EmbeddedPostgresError

        configured = cast(dict[str, dict[str, Any]], settings.CACHES)
        caches = [str(c.get("LOCATION")) for c in configured.values()
                  if str(c.get("BACKEND")).endswith(".DatabaseCache")]  # fmt: skip
        said = ""  # why it waited when it last said so: each new reason is told once
        while True:
            try:
                executor = MigrationExecutor(connection)
                plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
                missing = set(caches) - set(connection.introspection.table_names())
                why, waiting = ("migrations", (
                    f"The database is not ready ({len(plan)} migration(s) to apply, "
                    f"{len(missing)} cache table(s) to create): waiting for `manage.py "
                    "migrate` and `createcachetable` (or `serve`, which runs both)."
                )) if plan or missing else ("", "")  # fmt: skip
            except (DatabaseError, EmbeddedPostgresError) as exc:
                if isinstance(exc.__cause__, DatabaseMissing):  # (a first `serve` makes it)
                    why, waiting = "database", f"Waiting: {exc}"
                elif not said:  # not reachable: the cluster and the supervisor see to it
                    return
                else:
                    time.sleep(every)  # (mid-migration: a table being made)
                    continue
            finally:
                connection.close()
            if not why:
                if said:
                    self.stdout.write("The database is ready: starting.")
                return
            if why != said:  # (not again as the migrations left to apply go down)
                self.stdout.write(waiting)
                self.stdout.flush()
                said = why
            time.sleep(every)
