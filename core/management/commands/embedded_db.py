from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.embedded_pg import (
    ensure_embedded_postgres,
    postmaster_running,
    stop_embedded_postgres,
)


class Command(BaseCommand):
    help = "Start, stop or show the embedded PostgreSQL server (used when DATABASE_URL is unset)."
    # Stopping must work even when the server is down, so no system checks first.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["status", "start", "stop"])

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if not settings.EMBEDDED_DATABASE:
            raise CommandError("DATABASE_URL is set: there is no embedded database to manage.")
        if action == "stop":
            stopped = stop_embedded_postgres(settings.DATA_DIR)
            self.stdout.write("stopped" if stopped else "not running")
            return
        if action == "status" and not postmaster_running(
            Path(settings.DATA_DIR).resolve() / "pgdata"
        ):
            # (it started the server: undoing a db-stop before a cold copy)
            raise CommandError("not running")
        info = ensure_embedded_postgres(
            settings.DATA_DIR, dbname=settings.DATABASES["default"]["NAME"]
        )
        self.stdout.write(f"running pid={info.pid} socket={info.socket_dir} port={info.port}")
