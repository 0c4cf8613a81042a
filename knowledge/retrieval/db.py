"""How the engine's statements reach PostgreSQL.

Django's psycopg backend binds parameters on the client (``ClientCursor``), which cannot
prepare: every search used to parse and plan its SQL anew, about 0.5 ms per statement,
as much as running it on a small base. Here a statement goes through a server-binding
cursor on the same connection with ``prepare=True``: psycopg prepares it on its first
use on a connection and keeps it, and PostgreSQL caches its plan. The query vector is
always a parameter in pgvector's binary form (``VectorParam``), never text.

Settings a statement needs (HNSW, the plan cache mode) are sent before it in the same
round trip, local to its transaction (``set_config(..., true)``): outside a transaction
they end with it; inside the caller's they last until it ends, which the callers accept
(they only steer HNSW scans and plans).

Errors go through Django's wrapper (an outage marks the connection unusable as any query
would), and statements are logged where Django logs its own (``CaptureQueriesContext``).
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np
import psycopg
from django.db import close_old_connections, connection, connections
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types.datetime import TimestamptzLoader

from core import tenancy
from core.db_backend.base import pending_settings
from core.replicas import bound, read_connection
from core.tenancy import OWNER_SETTINGS, settings_params
from core.tracing import carry, statements_span

T = TypeVar("T")
Setting = tuple[str, object]
_ONLY_WHEN_ASKED = 2**31 - 1
# Threads running a search's second leg, or a retrieve call's other searches, each on its
# own connection.
LEG_WORKERS = 4
_POOL_THREADS = "search-leg"


class VectorParam:
    """A query vector as a statement parameter (``%s::vector``): sent in pgvector's binary
    form (2-byte dimensions, 2 bytes unused, big-endian float32s), where writing 384
    floats as text cost 0.17 ms a search and the server parsed them again."""

    __slots__ = ("values",)

    def __init__(self, values: Any):
        self.values = np.asarray(values, dtype=np.float32)


class _VectorBinaryDumper(Dumper):
    format = Format.BINARY  # oid 0: the server takes the type from the cast

    def dump(self, obj: VectorParam) -> bytes:
        return struct.pack(">HH", obj.values.shape[0], 0) + obj.values.astype(">f4").tobytes()


_with_vector_dumpers: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()

_PLACEHOLDER = re.compile(r"%(.)", re.DOTALL)


@lru_cache(maxsize=512)
def native_sql(sql: str) -> str:
    """``sql`` with PostgreSQL's own placeholders: ``$1``, ``$2``... for its ``%s``, ``%``
    for ``%%``; made once per statement text.

    psycopg converts a statement's ``%s`` on every execute and keeps the result only for
    statements up to 4 kB; the engine's are 5-9 kB, so each search parsed its SQL again
    in Python (26 us for a facts search of 0.7 ms). They run through a ``RawCursor``,
    which sends the text as it is."""
    count = 0

    def placeholder(match: re.Match[str]) -> str:
        nonlocal count
        if match[1] == "%":
            return "%"
        if match[1] != "s":
            raise ValueError(f"the engine's statements take %s placeholders only: {match[0]!r}")
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(placeholder, sql)


def _results_cursor(raw: psycopg.Connection[Any]) -> psycopg.RawCursor[Any]:
    """A cursor whose ``timestamptz`` values load through psycopg's own loader (its C
    version): Django's connections load them with a Python subclass of it, which gives
    the same value in the connection's zone (UTC) at five times the cost, 0.1 ms of a
    small search that returns ten facts with four times each."""
    cur = psycopg.RawCursor(raw)
    cur.adapters.register_loader("timestamptz", TimestamptzLoader)
    return cur


def _adapt_vectors(raw: psycopg.Connection[Any]) -> None:
    if raw not in _with_vector_dumpers:
        raw.adapters.register_dumper(VectorParam, _VectorBinaryDumper)
        _with_vector_dumpers.add(raw)


@dataclass(frozen=True)
class Statement:
    """A statement to run: SQL, parameters, whether to prepare it, settings it needs."""

    sql: str
    params: list[Any]
    prepare: bool = True
    local: list[Setting] = field(default_factory=list)


def fetch(
    sql: str, params: list[Any], prepare: bool = True, local: list[Setting] | None = None
) -> tuple[list[tuple[Any, ...]], list[str]]:
    """(rows, column names) of ``sql`` run on the reading connection (``core.replicas``),
    bound on the server.

    ``prepare=False``: planned for these values each time, for a statement whose best
    plan depends on them. ``local``: settings for the statement, sent before it in the
    same round trip.
    """
    return fetch_all([Statement(sql, params, prepare, local or [])])[0]


def fetch_all(statements: list[Statement]) -> list[tuple[list[tuple[Any, ...]], list[str]]]:
    """(rows, column names) of each statement, all sent at once and answered in one
    round trip (pipeline mode: the statements, each after its settings, then one Sync;
    outside a transaction they form one implicit transaction, so the settings end with
    it)."""
    started = time.monotonic()
    out = []
    connection = read_connection()  # the primary, or the replica this request reads from
    with statements_span([s.sql for s in statements]), connection.wrap_database_errors:
        connection.ensure_connection()
        connection.validate_no_broken_transaction()
        raw = connection.connection
        if raw.prepare_threshold is None:
            # Django turns preparing off (None) for connection poolers' sake; then even
            # prepare=True is ignored. Only statements asking for it are prepared here:
            # Django's own (client-side) cursors never prepare.
            raw.prepare_threshold = _ONLY_WHEN_ASKED
        _adapt_vectors(raw)
        owner = pending_settings(raw)
        if owner is not None:
            # Row-level security's owner settings (core.tenancy) go with the first
            # statement's, in the same round trip and transaction.
            carried = list(zip(OWNER_SETTINGS, settings_params(owner)))
            statements = [
                replace(statements[0], local=carried + statements[0].local),
                *statements[1:],
            ]
        cursors = [(psycopg.RawCursor(raw), _results_cursor(raw)) for _ in statements]
        try:
            if len(statements) == 1 and not statements[0].local:
                cursors[0][1].execute(native_sql(statements[0].sql), statements[0].params,
                                      prepare=statements[0].prepare)  # fmt: skip
            else:
                with raw.pipeline():
                    for (first, cur), s in zip(cursors, statements):
                        if s.local:
                            params = [str(v) for pair in s.local for v in pair]
                            first.execute(_settings_sql(len(s.local)), params, prepare=True)
                        cur.execute(native_sql(s.sql), s.params, prepare=s.prepare)
            for _, cur in cursors:
                out.append((cur.fetchall(), [c.name for c in cur.description or ()]))
        finally:
            for first, cur in cursors:
                first.close()
                cur.close()
    if connection.queries_logged:
        elapsed = f"{time.monotonic() - started:.3f}"
        for s in statements:
            connection.queries_log.append({"sql": f"{s.sql} -- {s.params!r}", "time": elapsed})
    return out


@lru_cache(maxsize=32)
def _settings_sql(count: int) -> str:
    return "SELECT " + ", ".join(
        f"set_config(${2 * i + 1}, ${2 * i + 2}, true)" for i in range(count)
    )


_legs_executor: ThreadPoolExecutor | None = None
_legs_executor_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _legs_executor
    with _legs_executor_lock:
        if _legs_executor is None:
            _legs_executor = ThreadPoolExecutor(
                max_workers=LEG_WORKERS, thread_name_prefix=_POOL_THREADS
            )
        return _legs_executor


def _forget_executor() -> None:
    # A forked child (gunicorn/qcluster workers) inherits the pool but not its threads.
    global _legs_executor, _legs_executor_lock
    _legs_executor, _legs_executor_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_executor)


def legs_reset() -> None:
    """Stop the legs' threads (each idle one closes its connections first); the next split search
    starts new ones. For the tests that change how connections are made (tracing)."""
    global _legs_executor
    with _legs_executor_lock:
        pool, _legs_executor = _legs_executor, None
    if pool is not None:
        for _ in range(LEG_WORKERS):
            pool.submit(connections.close_all)
        pool.shutdown(wait=True)


def _on_own_connection(fn: Callable[[], T]) -> T:
    try:
        return fn()
    finally:
        # What a request's end does: drop the connection if CONN_MAX_AGE says so or
        # it broke, keep it for the next search otherwise.
        close_old_connections()


def at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Run the first of ``calls`` here and each other on a pool thread (its own
    connection), all at once; their results in order.

    Inside a transaction they all run here, in order: another connection would not see
    the transaction's uncommitted writes. So they do on a pool thread: one waiting there
    for the pool could wait for itself.
    """
    pooled = threading.current_thread().name.startswith(_POOL_THREADS)
    if len(calls) < 2 or connection.in_atomic_block or pooled:
        return [call() for call in calls]
    # (the trace's context too, and the server the request reads from)
    # (as the request runs: its owner's rows, core.tenancy)
    futures = [
        _executor().submit(carry(_on_own_connection), bound(tenancy.bound(c))) for c in calls[1:]
    ]
    try:
        first = calls[0]()
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    return [first, *(future.result() for future in futures)]
