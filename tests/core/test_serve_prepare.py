"""What `manage.py serve` does before it starts its programs, in process (the command
itself, started for real, is in test_serve.py)."""

from __future__ import annotations

import fcntl
import os

import pytest

from core.management.commands import serve


def test_collectstatic_holds_the_static_root_while_it_writes(monkeypatch, tmp_path, settings):
    """Two serve commands starting at once in one checkout take turns: the second's
    collectstatic waits for the first's (before, one deleted the files the other wrote)."""
    settings.STATIC_ROOT = tmp_path
    ran: list[str] = []

    def command(name: str, **options) -> None:
        if name == "collectstatic":
            other = os.open(tmp_path, os.O_RDONLY)  # another process's attempt
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(other)
        ran.append(name)

    monkeypatch.setattr(serve, "call_command", command)
    monkeypatch.setattr(serve, "admin_ensure", lambda **kwargs: None)
    serve.Command()._prepare()
    assert ran == ["migrate", "createcachetable", "collectstatic"]
    free = os.open(tmp_path, os.O_RDONLY)  # released afterwards
    try:
        fcntl.flock(free, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(free)
