"""Search statements run as server-side prepared statements.

Django's psycopg backend binds parameters on the client (``ClientCursor``), which cannot
prepare: every search used to parse and plan its SQL anew, about 0.5 ms per statement
for the BM25 and context statements, as much as running them on a small base. Here a
statement goes through a server-binding cursor on the same connection with
``prepare=True``: psycopg prepares it on its first use on a connection and keeps it
(``prepared_max`` statements per connection), and PostgreSQL caches its plan (custom
plans for the first five runs, then a generic one if it costs no more). The search
statements take their values as parameters, so a few distinct texts cover every
search; the engine's search writes its row counts (limit, offset, pool) into the text,
because a LIMIT left unknown made the generic plan lose to a new custom plan each time
(``memories.facts.ranking.candidates_statement``).

Errors go through Django's wrapper (so an outage marks the connection unusable as any
query would), and statements are logged where Django logs its own (``CaptureQueriesContext``
and ``connection.queries`` see them).
"""

from __future__ import annotations

import struct
import time
import weakref
from typing import Any

import numpy as np
import psycopg
from django.db import connection
from psycopg.adapt import Dumper
from psycopg.pq import Format

_ONLY_WHEN_ASKED = 2**31 - 1


class VectorParam:
    """A query vector as a statement parameter (``%s::vector``): sent in pgvector's binary
    form (2-byte dimensions, 2 bytes unused, big-endian float32s), where writing 384
    floats as text cost 0.17 ms a search and the server parsed them again. For ``fetch``
    only: Django's own cursors bind on the client, in text."""

    __slots__ = ("values",)

    def __init__(self, values: Any):
        self.values = np.asarray(values, dtype=np.float32)


class _VectorBinaryDumper(Dumper):
    format = Format.BINARY  # oid 0: the server takes the type from the cast

    def dump(self, obj: VectorParam) -> bytes:
        return struct.pack(">HH", obj.values.shape[0], 0) + obj.values.astype(">f4").tobytes()


_with_vector_dumpers: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()


def _adapt_vectors(raw: psycopg.Connection[Any]) -> None:
    if raw not in _with_vector_dumpers:
        raw.adapters.register_dumper(VectorParam, _VectorBinaryDumper)
        _with_vector_dumpers.add(raw)


def fetch(
    sql: str,
    params: list[Any],
    prepare: bool = True,
    before: tuple[str, list[Any]] | None = None,
    local: list[tuple[str, object]] | None = None,
) -> tuple[list[tuple[Any, ...]], list[str]]:
    """(rows, column names) of ``sql`` run as a prepared statement on ``connection``.

    ``prepare=False``: bound on the server but planned for these values each time, for a
    statement whose best plan depends on them (a generic plan could scan the table).
    ``before``: a statement (``set_config(..., true)``, prepared too) run first in the
    same transaction and the same round trip (pipeline mode: both are sent, then one
    Sync; outside a transaction the two form one implicit transaction, so settings
    local to it end with it).

    ``local``: settings for the statement only (``set_config(name, value, true)``), sent
    the same way as ``before`` (and so, inside the caller's transaction, they would
    outlast the statement: there the caller must accept that).
    """
    started = time.monotonic()
    logged = f"{before[0]}; {sql}" if before else sql  # ``local`` settings are not logged
    with connection.wrap_database_errors:
        connection.ensure_connection()
        connection.validate_no_broken_transaction()
        raw = connection.connection
        if raw.prepare_threshold is None:
            # Django turns preparing off (None) for connection poolers' sake; then even
            # prepare=True is ignored. Only statements asking for it are prepared here:
            # Django's own (client-side) cursors never prepare.
            raw.prepare_threshold = _ONLY_WHEN_ASKED
        _adapt_vectors(raw)
        if local:
            setting_sql = "SELECT " + ", ".join("set_config(%s, %s, true)" for _ in local)
            before = (setting_sql, [str(v) for pair in local for v in pair])
        if before is None:
            with psycopg.Cursor(raw) as cur:
                cur.execute(sql, params, prepare=prepare)
                rows = cur.fetchall()
                names = [c.name for c in cur.description or ()]
        else:
            with psycopg.Cursor(raw) as first, psycopg.Cursor(raw) as cur:
                with raw.pipeline():
                    first.execute(*before, prepare=True)
                    cur.execute(sql, params, prepare=prepare)
                rows = cur.fetchall()
                names = [c.name for c in cur.description or ()]
    if connection.queries_logged:
        connection.queries_log.append(
            {
                "sql": f"{logged} -- {params!r}",
                "time": f"{time.monotonic() - started:.3f}",
            }  # fmt: skip
        )
    return rows, names
