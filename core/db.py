"""Small database helpers shared by the apps."""

from __future__ import annotations

import hashlib

from django.db import connection


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


def try_advisory_xact_lock(key: str) -> bool:
    """Like ``advisory_xact_lock`` but without waiting: whether the lock was taken."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [_lock_id(key)])
        return bool(cur.fetchone()[0])
