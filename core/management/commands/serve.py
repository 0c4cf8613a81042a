from __future__ import annotations

import argparse
import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.db import advisory_session_lock_wait
from core.db_recovery import watch_embedded
from core.errors import Conflict
from core.qcluster import QclusterProgram
from core.services import admin_ensure
from core.supervisor import Program, Supervisor
from memoryproject.env import env_int


def _at_least_one(text: str) -> int:
    """``--web-workers``: 0 was taken, and gunicorn listened with no worker to answer."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _bindable(host: str, port: int) -> None:
    """Refuse, in one line, an address the web server cannot listen on (a port in use,
    port 99999, a host that resolves to nothing): gunicorn exited at once and the
    supervisor restarted it forever, as it restarts a crash after a good start."""
    if not 0 < port < 65536:  # (getaddrinfo takes 99999 as 34463)
        raise CommandError(f"cannot listen on {host}:{port}: a port is 1 to 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as gunicorn)
            probe.bind(address)
    except (OSError, OverflowError) as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc}") from None


class Command(BaseCommand):
    help = (
        "Prepare the database and run the web server (gunicorn) and the django-q2 worker "
        "under one supervisor: either is restarted with backoff if it crashes, the worker "
        "also if it stalls (WORKER_STALL_SECONDS), the embedded database if it stops; "
        "Ctrl-C or SIGTERM stops everything, grandchildren included."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=env_int("PORT", 8000, minimum=1))
        parser.add_argument("--web-workers", type=_at_least_one, default=2)
        parser.add_argument("--no-worker", action="store_true", help="Run the web server only.")

    def handle(self, *args: Any, **options: Any) -> None:
        _bindable(options["host"], options["port"])
        self._prepare()
        supervisor = Supervisor(self._programs(options), periodic=[watch_embedded()])
        supervisor.run()
        self.stdout.write("Stopped.")

    def _prepare(self) -> None:
        # Web servers of several hosts may start at once on one database: one migrates
        # (and creates the cache table and the admin) while the others wait, then find
        # nothing left to do. Two migrations at once fail ("already exists").
        with advisory_session_lock_wait("serve:prepare"):
            self._prepare_database()
        with _locked(settings.STATIC_ROOT):
            call_command("collectstatic", interactive=False, verbosity=0)

    def _prepare_database(self) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("createcachetable", verbosity=0)
        username = os.environ.get("ADMIN_USERNAME", "admin")
        try:
            password = admin_ensure(username=username, password=os.environ.get("ADMIN_PASSWORD"))
        except Conflict as exc:  # (it was an IntegrityError's traceback)
            raise CommandError(str(exc)) from None
        if password:
            self.stdout.write(self.style.WARNING("Created the admin user (shown once):"))
            self.stdout.write(f"  username: {username}\n  password: {password}")

    def _programs(self, options: dict[str, Any]) -> list[Program]:
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
            "core.gunicorn_worker.JSONErrorThreadWorker",
            "--threads",
            "4",
            "--timeout",
            "120",
            # Idle keep-alive connections stay open 75 s (gunicorn's default is 2 s):
            # longer than clients keep idle connections (httpx 5 s, browsers and load
            # balancers ~60 s), so a client never reuses a connection the server is
            # closing (a poll every 2 s got "Server disconnected without sending a
            # response", and the server logged nothing).
            "--keep-alive",
            "75",
            "--graceful-timeout",
            "10",
            "--access-logfile",
            "-",
        ]
        web += _control_socket(options["port"])
        programs: list[Program] = [Program("web", web)]
        if not options["no_worker"]:
            programs.append(QclusterProgram(stall_seconds=settings.WORKER_STALL_SECONDS))
        self.stdout.write(f"Serving on http://{bind}/ (admin at /admin/, API docs at /api/docs/)")
        return programs


def _control_socket(port: int) -> list[str]:
    """gunicorn's control socket, one per instance: by default it is one path per user
    (``~/.gunicorn/gunicorn.ctl``) that every instance on the machine takes over from
    the one before. Here it lies in the data directory, named by the port; off when that
    path is too long for a Unix socket (108 bytes)."""
    path = settings.DATA_DIR / f"gunicorn-{port}.ctl"
    return ["--control-socket", str(path)] if len(str(path)) < 100 else ["--no-control-socket"]


@contextmanager
def _locked(directory: Any) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (flock on the directory itself: no file
    that the static files server would serve). Two ``serve`` commands starting at once
    in one checkout (two instances, a restart overlapping the old one's start) write the
    same STATIC_ROOT, and the manifest storage's post-processing of one deleted files the
    other was writing (FileNotFoundError, serve exits)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
