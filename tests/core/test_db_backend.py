"""The database backend of the embedded mode (core.db_backend): reading the settings
starts nothing; a process's first connection starts (or attaches to) the server, once,
and writes where it is into the database entry."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connections

from core.db_backend import base as backend
from core.embedded_pg import ServerInfo, postmaster_running, stop_embedded_postgres

ROOT = Path(__file__).resolve().parents[2]
INFO = ServerInfo(socket_dir="/run/pg-test", port=5433, user="postgres", dbname="app", pid=1)


@pytest.fixture
def starts(monkeypatch) -> list[tuple[Path, dict]]:
    """Every start of a server, recorded instead of run (each returns INFO)."""
    calls: list[tuple[Path, dict]] = []

    def start(data_dir: Path, **options) -> ServerInfo:
        calls.append((data_dir, options))
        return INFO

    monkeypatch.setattr(backend, "ensure_embedded_postgres", start)
    monkeypatch.setattr(backend, "_servers", {})
    return calls


def _entry(data_dir: Path, **fields) -> dict:
    wanted = {"shared_buffers": "128MB"}
    embedded = {"data_dir": data_dir, "dbname": "app", "server_settings": wanted}
    return {"NAME": "app", "USER": "", "HOST": "", "PORT": "", "EMBEDDED": embedded, **fields}


def test_the_first_connection_starts_the_server_once_and_says_where_it_is(starts, tmp_path):
    entries = [_entry(tmp_path) for _ in range(8)]
    threads = [threading.Thread(target=backend.embedded_server, args=(e,)) for e in entries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert starts == [
        (
            tmp_path.resolve(),
            {"dbname": "app", "server_settings": {"shared_buffers": "128MB"}, "service_role": None},
        )
    ]
    assert {(e["HOST"], e["PORT"], e["USER"]) for e in entries} == {
        ("/run/pg-test", "5433", "postgres")
    }
    assert backend.embedded_server(_entry(tmp_path)) == INFO
    assert len(starts) == 1  # later connections of the process find it started


def test_an_entry_pointed_elsewhere_or_not_embedded_is_left_alone(starts, tmp_path):
    elsewhere = _entry(tmp_path, HOST="127.0.0.1", PORT="9")
    backend.embedded_server(elsewhere)
    assert (elsewhere["HOST"], elsewhere["PORT"]) == ("127.0.0.1", "9")
    plain = {"NAME": "app", "HOST": "", "PORT": ""}
    assert backend.embedded_server(plain) is None
    assert plain == {"NAME": "app", "HOST": "", "PORT": ""}
    assert len(starts) == 1  # the first entry's start; the plain one started nothing


@pytest.mark.skipif(not settings.EMBEDDED_DATABASE, reason="DATABASE_URL is set")
def test_dbshell_is_pointed_at_the_server(monkeypatch, db):
    """A fresh wrapper of the settings (HOST empty, as read): ``dbshell`` finds the server."""
    connection = connections["default"]
    fresh = type(connection)({**connection.settings_dict, "HOST": "", "PORT": ""})
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kwargs: ran.append(args))
    fresh.client.runshell([])
    (args,) = ran
    host, port = args[args.index("-h") + 1], args[args.index("-p") + 1]
    assert (host, port) == (connection.settings_dict["HOST"], connection.settings_dict["PORT"])
    assert host and port


@pytest.mark.slow  # starts processes and a server
@pytest.mark.skipif(not settings.EMBEDDED_DATABASE, reason="DATABASE_URL is set")
def test_commands_that_need_no_database_start_none(tmp_path):
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "TESTING"}}
    env.update(MEMORY_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="memoryproject.settings")

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        assert "embedded_db" in manage("help")  # every app loaded, the settings read
        assert not (data_dir / "pgdata").exists()  # no server, not even initialised

        # the first command that connects starts it (`migrate`, which also makes the
        # database: other commands make none, core.embedded_pg.for_command)
        assert "Planned operations" in manage("migrate", "--plan")
        assert postmaster_running(data_dir / "pgdata")
        code = "from django.db import connection as c; c.ensure_connection(); print(c.settings_dict['HOST'])"
        host = manage("shell", "-c", code).strip().splitlines()[-1]
        assert host and Path(host, ".s.PGSQL.5432").exists()
    finally:
        stop_embedded_postgres(data_dir)
