"""``manage.py worker`` on a database not migrated yet says so once and waits, then
starts once ``migrate`` and ``createcachetable`` ran (it printed a traceback a second
until then: 16 tracebacks and 164 "django_cache does not exist" lines in 45 s). On an
embedded database not made yet it waits too (it made the database before: a mistyped
EMBEDDED_DB_NAME gave it an empty one), and other commands say so and make none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _wait_for(path: Path, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = path.read_text(errors="replace") if path.exists() else ""
        if text in said:
            return said
        time.sleep(0.3)
    raise AssertionError(f"no {text!r} in:\n{path.read_text(errors='replace')[-3000:]}")


def test_a_worker_on_an_unmigrated_database_waits_then_starts(tmp_path):
    from django.conf import settings

    if not settings.EMBEDDED_DATABASE:
        pytest.skip("starts an embedded server of its own data directory")
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update({"MEMORY_ENV_FILE": "", "MEMORY_DATA_DIR": str(tmp_path / "data"),
                "DATABASE_URL": "", "EMBEDDED_DB_NAME": "memory",
                "EMBEDDED_DB_SHARED_BUFFERS": "128MB", "LLM_BASE_URL": ""})  # fmt: skip
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen([sys.executable, "manage.py", "worker"], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        said = _wait_for(log, "does not exist on the server", 120)
        assert "Waiting: the database 'memory' (EMBEDDED_DB_NAME)" in said
        assert "it holds no database yet. `manage.py migrate` (or `serve`) creates it." in said
        typo = subprocess.run(
            [sys.executable, "manage.py", "export_memory", "alice"], cwd=ROOT,
            env={**env, "EMBEDDED_DB_NAME": "memroy"}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert typo.returncode == 1 and typo.stdout == ""
        assert (
            typo.stderr.splitlines()[-1].startswith(  # (after the system checks' warnings)
                "embedded database error: the database 'memroy' (EMBEDDED_DB_NAME) does not exist"
            )
            and "Traceback" not in typo.stderr
        ), typo.stderr
        # `migrate` makes the database (--plan: and applies nothing): the worker waits on
        subprocess.run([sys.executable, "manage.py", "migrate", "--plan"],
                       cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)  # fmt: skip
        said = _wait_for(log, "waiting for `manage.py migrate`", 60)
        assert said.count("The database is not ready") == 1
        databases = subprocess.run(
            [sys.executable, "manage.py", "shell", "-v0", "-c", "from django.db import connection as c;"
             "print(*sorted(r[0] for r in c.cursor().execute("
             "'SELECT datname FROM pg_database WHERE NOT datistemplate')))"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert databases.stdout.split() == ["memory", "postgres"]  # no "memroy"
        time.sleep(3)  # still waiting, quietly
        assert worker.poll() is None and "Traceback" not in log.read_text(errors="replace")
        for command in (["migrate", "-v0"], ["createcachetable"]):
            subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env,
                           check=True, capture_output=True, timeout=300)  # fmt: skip
        said = _wait_for(log, "Supervising the worker cluster", 60)
        assert "The database is ready: starting." in said
        assert said.count("The database is not ready") == 1 and "Traceback" not in said
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(60)
        subprocess.run([sys.executable, "manage.py", "embedded_db", "stop"], cwd=ROOT, env=env,
                       capture_output=True, timeout=120)  # fmt: skip
