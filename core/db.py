"""Small database helpers shared by the apps."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import DatabaseError, connection, connections


def _lock_id(key: str) -> int:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def advisory_xact_lock(key: str, *, shared: bool = False) -> None:
    """Hold a PostgreSQL advisory lock named by ``key`` until the transaction ends.

    The name is hashed with blake2b (not ``hash()``, which is salted per process) to
    the signed 64-bit id PostgreSQL takes, so every process agrees on it. Must be
    called inside ``transaction.atomic()``; outside one the lock ends at once.
    """
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cur:
        cur.execute(f"SELECT {function}(%s)", [_lock_id(key)])


def advisory_xact_lock_statement(key: str) -> tuple[str, list[int]]:
    """The statement (SQL, parameters) that takes ``advisory_xact_lock(key)``, for a
    caller that sends it with its next statement in one round trip (a pipeline: the
    next statement starts, and takes its snapshot, once the lock is held)."""
    return "SELECT pg_advisory_xact_lock(%s)", [_lock_id(key)]


def try_advisory_xact_lock(key: str) -> bool:
    """Like ``advisory_xact_lock`` but without waiting: whether the lock was taken."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [_lock_id(key)])
        return bool(cur.fetchone()[0])


@contextmanager
def advisory_session_lock(key: str) -> Iterator[bool]:
    """Try to take a session-level advisory lock named by ``key``; yields whether it did.

    Unlike the transaction-scoped locks above it spans transactions (and no
    transaction stays open meanwhile), so it can cover work that calls the network
    between its writes. Released on exit, or by PostgreSQL if the connection dies.
    """
    lock_id = _lock_id(key)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [lock_id])
        taken = bool(cur.fetchone()[0])
    try:
        yield taken
    finally:
        if taken:
            try:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
            except DatabaseError:  # the connection is gone, and the lock with it
                pass


@contextmanager
def advisory_session_lock_wait(key: str, *, every: float = 0.5) -> Iterator[None]:
    """Wait for the session-level advisory lock named by ``key`` and hold it for the
    block: what several processes on several hosts do one at a time. Released on
    exit, or by PostgreSQL if the connection dies.

    It asks again every ``every`` seconds rather than blocking in
    ``pg_advisory_lock``: a waiting statement is an open transaction, and the holder's
    ``CREATE INDEX CONCURRENTLY`` (a migration) waits for every open transaction to
    end: PostgreSQL reports the deadlock and the migration fails.
    """
    while True:
        with advisory_session_lock(key) as taken:
            if taken:
                yield
                return
        time.sleep(every)


def limit_web_statements() -> None:
    """Every connection this process opens from now on stops a statement after
    ``API_STATEMENT_TIMEOUT_SECONDS`` (libpq's ``options``, so it holds for each
    statement of every transaction, the search legs' and the replicas' connections
    too): a request cannot hold a connection for minutes. The web entry points call it
    (``memoryproject.wsgi``, ``asgi``); background work is bounded by ``Q_TIMEOUT``."""
    milliseconds = int(settings.API_STATEMENT_TIMEOUT_SECONDS * 1000)
    if milliseconds <= 0:
        return
    for alias in connections:
        options = connections.settings[alias].setdefault("OPTIONS", {})
        # (after any options of the URL: of two -c of one setting the last one holds)
        given = str(options.get("options", ""))
        options["options"] = f"{given} -c statement_timeout={milliseconds}".strip()
