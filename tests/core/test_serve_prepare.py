"""What `manage.py serve` does before it starts its programs, in process (the command
itself, started for real, is in test_serve.py)."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import psycopg
import pytest
from django.db import connection

from core.db import _lock_id
from core.management.commands import serve


@pytest.mark.django_db
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


@pytest.mark.django_db(transaction=True)
def test_hosts_starting_at_once_migrate_one_at_a_time(monkeypatch, tmp_path, settings):
    """While another host's serve holds the prepare lock (it is migrating), this one's
    migrate waits, and runs once that lock is let go."""
    settings.STATIC_ROOT = tmp_path
    ran: list[str] = []
    monkeypatch.setattr(serve, "call_command", lambda name, **options: ran.append(name))
    monkeypatch.setattr(serve, "admin_ensure", lambda **kwargs: None)
    other = psycopg.connect(_conninfo(), autocommit=True)  # the other host's connection
    try:
        other.execute("SELECT pg_advisory_lock(%s)", [_lock_id("serve:prepare")])
        thread = threading.Thread(target=_prepare_and_close)
        thread.start()
        time.sleep(1.5)
        assert ran == [] and thread.is_alive()  # waiting for the other host
        other.execute("SELECT pg_advisory_unlock(%s)", [_lock_id("serve:prepare")])
        thread.join(30)
    finally:
        other.close()
    assert not thread.is_alive()
    assert ran == ["migrate", "createcachetable", "collectstatic"]


def _prepare_and_close() -> None:
    try:
        serve.Command()._prepare()
    finally:
        connection.close()


def _conninfo() -> str:
    db = connection.settings_dict
    return f"host={db['HOST']} port={db['PORT']} user={db['USER']} dbname={db['NAME']}"


@pytest.mark.django_db
def test_an_owner_named_as_the_admin_is_refused_in_one_line_and_not_promoted():
    """``create_api_key admin --create-user`` made an API owner named admin; serve then
    failed to start with an IntegrityError's traceback (an operator's audit). It stops
    with one line, and the owner is not made a superuser."""
    from django.contrib.auth.models import User

    from core.errors import Conflict
    from core.services import admin_ensure

    User.objects.create_user("admin")
    with pytest.raises(Conflict, match="a user named 'admin' exists and is no superuser"):
        admin_ensure(username="admin")
    assert not User.objects.filter(is_superuser=True).exists()
    assert admin_ensure(username="root") is not None  # (another name: made as before)
    assert User.objects.get(is_superuser=True).username == "root"
