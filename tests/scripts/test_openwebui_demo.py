"""The Open WebUI demo output of docs/tools.md, reproduced: ``scripts/openwebui/run.sh`` as it
is (the demo model, the memory service on a database of its own, ``demo.py``), with a
stand-in for Open WebUI (``openwebui_stand_in.py``: the part of its API the demo
drives, relayed to the proxy as Open WebUI does). Every line of the docs' output
block comes out, in order."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.embedded_pg import stop_embedded_postgres

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
STAND_IN = Path(__file__).with_name("openwebui_stand_in.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readme_demo_output() -> str:
    """The demo's output block, wherever the docs keep it (README.md or docs/)."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]:
        text = path.read_text() if path.exists() else ""
        match = re.search(r"```text\n(== models Open WebUI lists.*?)```", text, re.S)
        if match:
            return match.group(1)
    raise AssertionError("no Open WebUI demo output block in README.md or docs/")


def steps(output: str) -> list[tuple[str, object]]:
    """The demo's steps: (title, value), a value printed as JSON read as JSON (the README
    shows it on one line, the script indented)."""
    out = []
    for part in re.split(r"^== ", output, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        try:
            value: object = json.loads(body)
        except ValueError:
            value = body.strip()
        out.append((title.strip(), value))
    return out


def test_the_readme_demo_output_is_reproduced(tmp_path):
    venv = tmp_path / "owui-venv"
    (venv / "bin").mkdir(parents=True)
    launcher = venv / "bin" / "open-webui"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} {STAND_IN} "$@"\n')
    launcher.chmod(0o755)
    work = tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    for name in ("DATABASE_URL", "LLM_BASE_URL", "LLM_MODEL", "LLM_API_KEY"):
        env.pop(name, None)
    env.update(
        OWUI_WORK=str(work), OWUI_VENV=str(venv), MEMORY_DATA_DIR=str(tmp_path / "unused"),
        SERVICE_PORT=str(_free_port()), DEMO_LLM_PORT=str(_free_port()),
        OWUI_PORT=str(_free_port()), EMBEDDING_PROVIDER="hashing",
    )  # fmt: skip
    try:
        done = subprocess.run(["bash", "scripts/openwebui/run.sh"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        stop_embedded_postgres(work / "memory-data")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    ran = iter(steps(done.stdout))
    missing = [step for step in steps(readme_demo_output()) if step not in ran]
    assert not missing, f"not in the demo's output, in order: {missing}\n{done.stdout}"
