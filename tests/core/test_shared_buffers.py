"""The embedded server's ``shared_buffers``: a quarter of the memory the process may use
(the machine's, or its container's limit when lower), from 128MB to 8GB, unless
``EMBEDDED_DB_SHARED_BUFFERS`` says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memoryproject.env import shared_buffers_for, usable_memory

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


@pytest.mark.parametrize(
    "memory,expected",
    [(24 * GiB, "6144MB"), (2 * GiB, "512MB"), (256 * 2**20, "128MB"), (256 * GiB, "8192MB")],
)
def test_a_quarter_of_the_memory_within_bounds(memory, expected):
    assert shared_buffers_for(memory) == expected


def test_a_container_limit_below_the_machine_s_memory_wins(tmp_path):
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v2, v1, unset = tmp_path / "memory.max", tmp_path / "limit_in_bytes", tmp_path / "none"
    v2.write_text(f"{2 * GiB}\n")
    v1.write_text("max\n")  # (no limit)
    assert usable_memory((str(unset), str(v1))) == machine
    assert usable_memory((str(v2), str(v1), str(unset))) == min(machine, 2 * GiB)


def test_a_system_that_does_not_say_counts_as_4_gib(monkeypatch, tmp_path):
    def unknown(name):
        raise ValueError(name)

    monkeypatch.setattr(os, "sysconf", unknown)
    assert usable_memory((str(tmp_path / "none"),)) == 4 * GiB
    assert shared_buffers_for(usable_memory(())) == "1024MB"


def _setting(**env: str | None) -> str:
    """The setting as a new process reads it, with ``env`` over this one's (None: unset)."""
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.EMBEDDED_DB_OPTIONS['server_settings']['shared_buffers'])"
    )
    merged = {**os.environ, "MEMORY_ENV_FILE": "", **env}
    merged.pop("DATABASE_URL", None)
    clean = {k: v for k, v in merged.items() if v is not None}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return out.stdout.strip()


def test_the_settings_take_it_unless_the_variable_says_otherwise():
    assert _setting(EMBEDDED_DB_SHARED_BUFFERS=None) == shared_buffers_for(usable_memory())
    assert _setting(EMBEDDED_DB_SHARED_BUFFERS="1GB") == "1GB"
