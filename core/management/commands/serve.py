from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from core.services import admin_ensure


class Command(BaseCommand):
    help = (
        "Prepare the database and run the web server (gunicorn) and the django-q2 worker "
        "together; Ctrl-C or SIGTERM stops both."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--no-worker", action="store_true", help="Run the web server only.")

    def handle(self, *args: Any, **options: Any) -> None:
        self._prepare()
        children = self._start(options)
        self._supervise(children)

    def _prepare(self) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("createcachetable", verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        username = os.environ.get("ADMIN_USERNAME", "admin")
        password = admin_ensure(username=username, password=os.environ.get("ADMIN_PASSWORD"))
        if password:
            self.stdout.write(self.style.WARNING("Created the admin user (shown once):"))
            self.stdout.write(f"  username: {username}\n  password: {password}")

    def _start(self, options: dict[str, Any]) -> list[subprocess.Popen[bytes]]:
        bind = f"{options['host']}:{options['port']}"
        web = [
            sys.executable,
            "-m",
            "gunicorn",
            "memoryproject.wsgi:application",
            "--bind",
            bind,
            "--workers",
            str(options["web_workers"]),
            "--worker-class",
            "gthread",
            "--threads",
            "4",
            "--timeout",
            "120",
            "--access-logfile",
            "-",
        ]
        children = [subprocess.Popen(web)]
        if not options["no_worker"]:
            manage = str(settings.BASE_DIR / "manage.py")
            children.append(subprocess.Popen([sys.executable, manage, "qcluster"]))
        self.stdout.write(f"Serving on http://{bind}/ (admin at /admin/, API docs at /api/docs/)")
        return children

    def _supervise(self, children: list[subprocess.Popen[bytes]]) -> None:
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exit_code = 0
        while not stopping:
            exited = [c for c in children if c.poll() is not None]
            if exited:
                exit_code = exited[0].returncode or 1
                self.stderr.write(f"process {exited[0].args!r} exited; stopping the others")
                break
            time.sleep(0.2)
        self._terminate(children)
        self.stdout.write("Stopped.")
        if exit_code:
            raise SystemExit(exit_code)

    def _terminate(self, children: list[subprocess.Popen[bytes]]) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
