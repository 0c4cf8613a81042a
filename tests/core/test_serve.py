"""`make run` end to end: `manage.py serve` migrates, creates the admin once, serves the
admin, the API docs and /healthz with a live worker, and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from core.db_backend.base import embedded_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def serve_env():
    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs against the embedded server; DATABASE_URL is set")
    dbname = f"serve_e2e_{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update(
        EMBEDDED_DB_NAME=dbname,
        PORT=str(_free_port()),
        ADMIN_PASSWORD="e2e-password",
    )
    yield env
    db = settings.DATABASES["default"]
    embedded_server(db)  # its HOST and PORT are filled on a process's first connection
    with psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db.get("OWNER_USER") or db["USER"],
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _serve(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--web-workers", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _wait_healthy(base: str, proc: subprocess.Popen[str], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            status, raw = _get(base + "/healthz")
            body = json.loads(raw)
            # (the host's own worker counts once its supervisor has noted the cluster it
            # started, a moment after the cluster's first heartbeat)
            if status == 200 and body["worker"]["status"] == "ok" and body["status"] == "ok":
                return body
        except (OSError, ValueError):  # refused, reset or slow while booting
            pass
        time.sleep(0.5)
    raise AssertionError(f"never healthy with a worker: {body}")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=40)
    return output


def test_serve_runs_web_and_worker_and_stops_cleanly(serve_env):
    base = f"http://127.0.0.1:{serve_env['PORT']}"
    proc = _serve(serve_env)
    try:
        health = _wait_healthy(base, proc)
        assert health["status"] == "ok"
        assert health["pgvector"] == {"status": "ok"}  # strangers get the statuses only
        assert _get(base + "/admin/login/")[0] == 200
        status, docs = _get(base + "/api/docs/")
        assert status == 200
        css = next(
            part.split('"')[0]
            for part in docs.decode().split('href="')[1:]
            if part.split('"')[0].endswith(".css")
        )
        assert _get(base + css)[0] == 200  # Swagger UI assets are served locally
        # gunicorn's control socket is this instance's, not the user's shared one
        control = settings.DATA_DIR / f"gunicorn-{serve_env['PORT']}.ctl"
        assert control.is_socket()
    finally:
        output = _stop(proc)
    assert proc.returncode == 0, output
    assert "Created the admin user (shown once)" in output
    assert "password: e2e-password" in output
    assert "Stopped." in output

    # Second start: the admin exists, nothing is printed about it.
    proc = _serve(serve_env)
    try:
        _wait_healthy(base, proc)
    finally:
        output = _stop(proc)
    assert proc.returncode == 0
    assert "Created the admin user" not in output
