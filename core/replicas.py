"""Reads from streaming replicas, with read-your-writes (issue 28).

With ``DATABASE_REPLICA_URLS`` set, each replica is a database alias (``replica1``, ...).
A request of the API that only reads (``GET``, or a view that says ``reads = True``: the
searches, retrieval, an injection's block) reads from a replica; everything else, and
every read inside a transaction, stays on the primary (``default``). Background work and
the admin read from the primary.

**Read-your-writes.** After each request of an owner that may have written (any request
that is not a read, answered 2xx/3xx, or 5xx since a failure may come after a commit),
the primary's WAL insert position is recorded for that owner in ``core_writeposition``,
on the primary, so every web process and host sees it. A read of that owner goes to a
replica only once the replica's replay position has passed it; else to the primary. The
position is recorded before the response leaves, so a client that saw its write
acknowledged cannot read a replica that lacks it. (Per owner, not per end user: a write
of any of an owner's end users keeps all of that owner's reads on the primary until the
replica has it, which is safe and costs only offload.)

**A replica is skipped** when it is down (then for ``DOWN_FOR`` seconds in this process)
or lags more than ``REPLICA_MAX_LAG_SECONDS``. A read that fails on a replica
(the replica died mid-request, or cancelled the statement for a conflict with
recovery) is answered again from the primary, so a replica's failure never turns into a
5xx. Both legs of a split search run on the server the
request chose (``bound``).

Which server served a read is in the response's ``X-Read-From`` header (``primary``,
``replica``, or ``primary (the replica failed)``) when replicas are configured.
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest, HttpResponse
from django.http.request import RawPostDataException

logger = logging.getLogger("core.replicas")

T = TypeVar("T")

# Seconds a replica that failed is left alone (in this process) before it is tried again.
DOWN_FOR = 5.0
HEADER = "X-Read-From"
RETRIED = "primary (the replica failed)"


@dataclass
class _Reads:
    """How the current request reads."""

    read_only: bool = False  # the view only reads: it may read from a replica
    alias: str = DEFAULT_DB_ALIAS
    owner_id: int | None = None
    primary_only: bool = False  # answered again from the primary: no replica this time


_reads: contextvars.ContextVar[_Reads | None] = contextvars.ContextVar("reads", default=None)
_down_until: dict[str, float] = {}
_down_lock = threading.Lock()


def replica_aliases() -> list[str]:
    return list(getattr(settings, "DATABASE_REPLICAS", ()))


def read_alias() -> str:
    """The database alias the current code reads from: a replica only in a read-only
    request that chose one, and never inside a transaction on the primary."""
    state = _reads.get()
    if state is None or state.alias == DEFAULT_DB_ALIAS:
        return DEFAULT_DB_ALIAS
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return DEFAULT_DB_ALIAS
    return state.alias


def read_connection() -> BaseDatabaseWrapper:
    """The connection for the current code's reads (``read_alias``)."""
    return connections[read_alias()]


def bound(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` reading from the server the current request chose, wherever it runs (the
    second leg of a split search, on a pool thread)."""
    alias = read_alias()
    if alias == DEFAULT_DB_ALIAS:
        return fn

    def run() -> T:
        token = _reads.set(_Reads(read_only=True, alias=alias))
        try:
            return fn()
        finally:
            _reads.reset(token)

    return run


class ReplicaRouter:
    """Django's router: the ORM's reads follow ``read_alias``; writes and migrations go
    to the primary."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        alias = read_alias()
        return None if alias == DEFAULT_DB_ALIAS else alias

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True  # one database: the replicas are copies of the primary

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == DEFAULT_DB_ALIAS


# --- choosing a server ------------------------------------------------------------------


def owner_known(owner_id: int) -> None:
    """Authentication found the request's owner: a read-only request now chooses where
    it reads."""
    state = _reads.get()
    if state is None:
        return
    state.owner_id = owner_id
    if state.read_only and not state.primary_only:
        state.alias = choose(owner_id)


def choose(owner_id: int) -> str:
    """A replica that is up, lags at most ``REPLICA_MAX_LAG_SECONDS`` and has replayed the
    owner's last write; else the primary."""
    candidates = [a for a in replica_aliases() if not _is_down(a)]
    if not candidates:
        return DEFAULT_DB_ALIAS
    try:
        needed = _written_position(owner_id)
    except DatabaseError as exc:  # the primary answers the request (and its outage) itself
        logger.warning("could not read the owner's write position: %s", exc)
        return DEFAULT_DB_ALIAS
    random.shuffle(candidates)
    for alias in candidates:
        status = _replica_status(alias)
        if status is None:
            continue
        replayed, lag = status
        if lag <= settings.REPLICA_MAX_LAG_SECONDS and (needed is None or replayed >= needed):
            return alias
    return DEFAULT_DB_ALIAS


def _written_position(owner_id: int) -> int | None:
    with connections[DEFAULT_DB_ALIAS].cursor() as cur:
        cur.execute("SELECT lsn FROM core_writeposition WHERE owner_id = %s", [owner_id])
        row = cur.fetchone()
    return int(row[0]) if row else None


# Replay position (bytes since 0/0; NULL on a server not in recovery, which is no standby:
# pg_last_wal_replay_lsn() stays at its last crash recovery's end there) and lag in
# seconds: no lag while everything received is replayed (an idle primary sends nothing,
# and the last replayed commit grows old).
_STATUS_SQL = (
    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() - '0/0'::pg_lsn END, "
    "CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 ELSE "
    "COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 0) END"
)


def _read_status(alias: str) -> tuple[int | None, float]:
    """(replayed position or None on a server not in recovery, lag) of the replica; a
    replica that does not answer is marked down for ``DOWN_FOR`` seconds and raises."""
    try:
        with connections[alias].cursor() as cur:
            cur.execute(_STATUS_SQL)
            replayed, lag = cur.fetchone()
    except DatabaseError as exc:
        mark_down(alias, exc)
        raise
    return (None if replayed is None else int(replayed)), float(lag)


def _replica_status(alias: str) -> tuple[int, float] | None:
    """(replayed position, lag) of the replica, or None when it cannot be read or is not
    a standby."""
    try:
        replayed, lag = _read_status(alias)
    except DatabaseError:
        return None
    if replayed is None:  # not in recovery: a promoted or misconfigured replica
        logger.warning("replica %s is not a standby; not reading from it", alias)
        return None
    return replayed, lag


def replicas_health() -> list[dict[str, Any]]:
    """Each replica as ``/healthz`` reports it: ``ok``, ``lagging`` (further behind than
    ``REPLICA_MAX_LAG_SECONDS``: skipped), ``down`` (does not answer: skipped) or
    ``not_standby`` (answers, but is not in recovery: never read from), with its lag."""
    out = []
    for alias in replica_aliases():
        entry: dict[str, Any] = {"alias": alias, "status": "down", "lag_seconds": None}
        try:
            replayed, lag = _read_status(alias)
        except DatabaseError as exc:
            entry["error"] = str(exc).strip()
        else:
            lagging = lag > settings.REPLICA_MAX_LAG_SECONDS
            entry["status"] = "not_standby" if replayed is None else "lagging" if lagging else "ok"
            entry["lag_seconds"] = None if replayed is None else round(lag, 3)
        out.append(entry)
    return out


def mark_down(alias: str, exc: BaseException | None = None) -> None:
    logger.warning("replica %s is down for %.0f s: %s", alias, DOWN_FOR, exc)
    with _down_lock:
        _down_until[alias] = time.monotonic() + DOWN_FOR
    try:
        connections[alias].close()
    except DatabaseError:
        pass


def _is_down(alias: str) -> bool:
    with _down_lock:
        return time.monotonic() < _down_until.get(alias, 0.0)


# --- recording writes -------------------------------------------------------------------

_RECORD_SQL = (
    "INSERT INTO core_writeposition (owner_id, lsn, recorded_at) "
    "VALUES (%s, pg_current_wal_insert_lsn() - '0/0'::pg_lsn, now()) "
    "ON CONFLICT (owner_id) DO UPDATE SET lsn = GREATEST(core_writeposition.lsn, "
    "excluded.lsn), recorded_at = excluded.recorded_at"
)


def record_write(owner_id: int) -> None:
    """The owner's reads wait for a replica to replay everything written so far."""
    with connections[DEFAULT_DB_ALIAS].cursor() as cur:
        cur.execute(_RECORD_SQL, [owner_id])


def wrote(owner_id: int) -> None:
    """A write of the owner's outside a request's own time (a streamed answer records its
    turn while it streams, after the middleware has answered): recorded now. Inside a
    request the middleware records it as the request ends."""
    if replica_aliases() and _reads.get() is None:
        record_write(owner_id)


# --- the middleware ---------------------------------------------------------------------


def _is_read_view(request: HttpRequest, view_func: Any) -> bool:
    from rest_framework.views import APIView

    view_class = getattr(view_func, "cls", None)
    if not isinstance(view_class, type) or not issubclass(view_class, APIView):
        return False  # the admin, the chat proxy, MCP: the primary
    if getattr(view_class, "tools_may_write", False):
        return False  # the tools: read-only keys may call them, but a tool may write
    writes = getattr(view_class, "get_writes", None)
    if request.method == "GET" and writes is not None and writes(request):
        return False  # a GET that writes (a summarized history): it reads what it advances
    return request.method in ("GET", "HEAD", "OPTIONS") or bool(getattr(view_class, "reads", False))


class ReplicaReadsMiddleware:
    """Chooses where a request reads and records where its writes ended (module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not replica_aliases():
            return self.get_response(request)
        state = _Reads()
        token = _reads.set(state)
        try:
            response = self.get_response(request)
            if state.alias != DEFAULT_DB_ALIAS and response.status_code >= 500:
                response = self._again_on_primary(request, state, response)
            self._finish(request, state, response)
            return response
        finally:
            _reads.reset(token)

    def process_view(self, request: HttpRequest, view_func: Any, *args: Any) -> None:
        state = _reads.get()
        if state is None or state.primary_only or not _is_read_view(request, view_func):
            return None
        try:
            _ = request.body  # kept, so that the request can be answered again from the primary
        except RawPostDataException:
            return None
        state.read_only = True
        return None

    def _again_on_primary(
        self, request: HttpRequest, state: _Reads, failed: HttpResponse
    ) -> HttpResponse:
        """A read that failed on a replica, answered from the primary (it wrote nothing).
        The replica is left alone a while only if it no longer answers: a statement the
        standby cancelled (a conflict with recovery) is not an outage."""
        logger.warning("a read on %s answered %s; answering it from the primary",
                       state.alias, failed.status_code)  # fmt: skip
        _replica_status(state.alias)  # (marks it down if it does not answer)
        state.alias, state.read_only, state.primary_only = DEFAULT_DB_ALIAS, False, True
        return self.get_response(request)

    def _finish(self, request: HttpRequest, state: _Reads, response: HttpResponse) -> None:
        if state.primary_only:
            response[HEADER] = RETRIED
            return
        if state.read_only:
            response[HEADER] = "primary" if state.alias == DEFAULT_DB_ALIAS else "replica"
            return
        user = getattr(request, "user", None)  # (DRF sets it for a key's owner too)
        if user is None or not user.is_authenticated or 400 <= response.status_code < 500:
            return  # nobody's, or refused: nothing was written
        try:
            record_write(user.pk)
        except DatabaseError as exc:  # the primary is gone: so are reads that need it
            logger.warning("could not record the owner's write position: %s", exc)
