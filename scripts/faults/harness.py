"""A real served instance on loopback with its own data directory, for fault runs.

Everything here drives real processes: ``manage.py serve`` (gunicorn + the supervised
worker cluster) on a free port, an embedded PostgreSQL in a private ``MEMORY_DATA_DIR``
(never the developer's or the test run's), and ``kill -9``s. Used by
``scripts/fault_suite.py`` and by the slow process tests.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

ROOT = Path(__file__).resolve().parents[2]
WORKER_TITLE = re.compile(r"^qcluster \S+ (idle|processing)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any
    seconds: float

    @property
    def json_shape(self) -> bool:
        error = self.body.get("error") if isinstance(self.body, dict) else None
        return isinstance(error, dict) and "code" in error and "message" in error


def title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


@dataclass
class Instance:
    """One served instance. ``start()`` runs ``manage.py <command>`` (``serve``)."""

    env_overrides: dict[str, str] = field(default_factory=dict)
    data_dir: Path | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    key: str = ""
    log_path: Path | None = None

    def __post_init__(self) -> None:
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="memory-faults-"))
        self.data_dir = Path(self.data_dir).resolve()
        self.port = self.port or free_port()
        self.log_path = self.data_dir / "serve.log"

    # --- environment and commands --------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"TESTING", "DJANGO_SETTINGS_MODULE", "DATABASE_URL"}
            and not k.startswith(("LLM_", "EMBEDDING_"))
        }
        env.update(
            MEMORY_DATA_DIR=str(self.data_dir),
            EMBEDDED_DB_NAME="memory",
            EMBEDDED_DB_SHARED_BUFFERS="128MB",
            EMBEDDING_PROVIDER="hashing",
            SECRET_KEY="fault-suite-secret-key-not-for-production",
            ADMIN_PASSWORD="fault-suite-password",
            PORT=str(self.port),
            LOG_LEVEL="WARNING",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env_overrides)
        return env

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def manage(self, *args: str, timeout: float = 180) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self, *command: str) -> None:
        """Run ``manage.py <command>`` (default ``serve``) as the instance's process."""
        self.proc = self.spawn(*(command or ("serve", "--web-workers", "2")))

    def spawn(self, *command: str, **env: str) -> subprocess.Popen[bytes]:
        """Start ``manage.py <command>`` in this instance's environment, logging to
        ``serve.log``; the caller stops it."""
        assert self.log_path is not None
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it
        try:
            return subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), *command],
                cwd=ROOT,
                env={**self.env, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def log(self) -> str:
        assert self.log_path is not None
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_healthy(self, timeout: float = 120, worker: bool = True) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        body: Any = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"serve exited ({self.proc.returncode}):\n{self.log()[-3000:]}")
            try:
                reply = self.get("/healthz", auth=False, timeout=5)
                body = reply.body
                if reply.status == 200 and (not worker or body["worker"]["status"] == "ok"):
                    return body
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"never healthy: {body}\n{self.log()[-3000:]}")

    def ensure_key(self) -> str:
        """The suite's own key (user ``fault``), made once."""
        if not self.key:
            self.key = self.key_for("fault")
        return self.key

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def destroy(self) -> None:
        """Stop serving, stop this instance's database, remove its data directory."""
        self.stop()
        from core.embedded_pg import stop_embedded_postgres

        try:
            stop_embedded_postgres(self.data_dir)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pid = self.postmaster_pid()
            if pid:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    # --- HTTP ----------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: bool = True,
        timeout: float = 30,
    ) -> Reply:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if auth:
            headers["Authorization"] = f"Bearer {self.ensure_key()}"
        req = urllib.request.Request(self.base_url + path, data, headers, method=method)
        started = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                raw, status, hdrs = response.read(), response.status, dict(response.headers)
        except urllib.error.HTTPError as exc:
            raw, status, hdrs = exc.read(), exc.code, dict(exc.headers)
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")[:200]
        return Reply(status, hdrs, parsed, time.monotonic() - started)

    def raw(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        *,
        key: str | None = None,
        timeout: float = 30,
    ) -> Reply:
        """A request exactly as given (bytes, any header, any path): http.client, so
        nothing is quoted or checked on the way out. ``key`` (default the suite's own;
        "" for none) goes in ``Authorization`` unless ``headers`` has one."""
        sent = dict(headers or {})
        if key is None:
            key = self.ensure_key()
        if key and "Authorization" not in sent:
            sent["Authorization"] = f"Bearer {key}"
        started = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.putrequest(method, path, skip_accept_encoding=True)
            for name, value in sent.items():
                connection.putheader(name, value.encode("latin-1"))
            if data is not None:
                connection.putheader("Content-Length", str(len(data)))
            connection.endheaders(data)
            response = connection.getresponse()
            raw, status, hdrs = response.read(), response.status, dict(response.headers)
        finally:
            connection.close()
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")[:200]
        return Reply(status, hdrs, parsed, time.monotonic() - started)

    def key_for(self, username: str) -> str:
        """A new API key of ``username`` (created if need be)."""
        out = self.manage("create_api_key", username, "--create-user")
        return out.strip().splitlines()[-1]

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any, **kwargs: Any) -> Reply:
        return self.request("POST", path, body, **kwargs)

    def enqueue_sleeps(self, count: int, seconds: float, prefix: str) -> None:
        """Queue ``count`` tasks ``time.sleep(seconds)`` named ``<prefix>-<n>``."""
        self.manage(
            "shell",
            "-c",
            "from django_q.tasks import async_task\n"
            f"for i in range({count}): async_task('time.sleep', {seconds}, "
            f"task_name=f'{prefix}-{{i}}')",
        )

    def finished(self, prefix: str) -> int:
        return self.query("SELECT count(*) FROM django_q_task WHERE name LIKE %s", [prefix + "-%"])[
            0
        ][0]

    # --- database (straight to the instance's server, no Django) ---------------------
    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        lines = (self.data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
        conninfo = f"host={lines[4]} port={lines[3]} user=postgres dbname=memory"
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    # --- processes -----------------------------------------------------------------
    def tree(self) -> list[psutil.Process]:
        return descendants(self.proc.pid) if self.proc else []

    def whole_tree(self, expect: int = 8, timeout: float = 60) -> list[psutil.Process]:
        """serve's tree once it has ``expect`` processes (gunicorn 1+2, cluster main,
        sentinel, 2+2), or as it is after ``timeout``: /healthz answers ok before the
        cluster has spawned every worker on a loaded machine, and can say so from the
        previous serve's heartbeat (a data directory shared by several starts)."""
        deadline = time.monotonic() + timeout
        tree = self.tree()
        while len(tree) < expect and time.monotonic() < deadline:
            time.sleep(0.5)
            tree = self.tree()
        return tree

    def cluster_main(self, supervisor: int | None = None) -> psutil.Process | None:
        """The worker cluster's main process (a child of serve, or of ``supervisor``)."""
        pid = supervisor or (self.proc.pid if self.proc else None)
        if pid is None:
            return None
        for child in psutil.Process(pid).children():
            text = title(child)
            if "--run-cluster" in text or text.startswith("qcluster"):
                return child
        return None

    def workers(self, supervisor: int | None = None) -> list[psutil.Process]:
        main = self.cluster_main(supervisor)
        if main is None:
            return []
        return [p for p in descendants(main.pid) if WORKER_TITLE.match(title(p))]
