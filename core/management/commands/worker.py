from __future__ import annotations

from typing import Any

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
        supervisor = Supervisor([QclusterProgram(stall_seconds=stall)], periodic=[watch_embedded()])
        self.stdout.write(f"Supervising the worker cluster (stall limit {stall:.0f}s)")
        supervisor.run()
        self.stdout.write("Stopped.")
