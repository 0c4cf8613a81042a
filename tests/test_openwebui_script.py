"""``scripts/openwebui/run.sh`` keeps the demo's data apart from yours: its memory service
migrates and writes an embedded database of its own (``<work>/memory-data``), never the
data directory (or ``DATABASE_URL``) the environment names, and stops that database at
the end. Open WebUI is a stand-in here (answers its health check, refuses the demo's
sign-up), so the run stops at the demo's first step; the real one is in docs/tools.md."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.embedded_pg import postmaster_running, stop_embedded_postgres

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STAND_IN = f"""#!{sys.executable}
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def _answer(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{{}}")

    def do_GET(self):
        self._answer(200)

    def do_POST(self):
        self._answer(400)

HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Handler).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_demo_uses_a_database_of_its_own(tmp_path):
    venv = tmp_path / "owui-venv"
    (venv / "bin").mkdir(parents=True)
    stand_in = venv / "bin" / "open-webui"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    yours = tmp_path / "your-data"
    work = tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.pop("DATABASE_URL", None)
    env.pop("LLM_BASE_URL", None)
    env.update(
        MEMORY_DATA_DIR=str(yours), OWUI_WORK=str(work), OWUI_VENV=str(venv),
        SERVICE_PORT=str(_free_port()), DEMO_LLM_PORT=str(_free_port()),
        OWUI_PORT=str(_free_port()),
    )  # fmt: skip
    try:
        done = subprocess.run(
            ["bash", "scripts/openwebui/run.sh"], cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
    finally:  # whatever happened, no database server outlives the test
        running = [stop_embedded_postgres(d) for d in (yours, work / "memory-data")]
    output = done.stdout + done.stderr
    # The demo reached Open WebUI: the service migrated, made its key and served /healthz.
    assert done.returncode != 0 and "/api/v1/auths/signin -> 400" in output, output
    assert not yours.exists()  # your data directory: not created, not migrated
    assert (work / "memory-data" / "pgdata" / "PG_VERSION").exists()
    assert not postmaster_running(work / "memory-data" / "pgdata")  # stopped at the end
    assert running == [False, False]
