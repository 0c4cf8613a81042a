"""What the service does while its database is unreachable.

Every request that needs the database answers 503 ``database_unavailable`` (the
project's JSON error shape, OpenAI's under ``/v1/``) with ``Retry-After``, never a
500. In embedded mode the process that notices starts the server again in a
background thread (``ensure_embedded_postgres`` under its file lock: of several
processes noticing at once, one starts it and the others find it running);
``manage.py serve`` and ``manage.py worker`` also watch the postmaster every second.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, models
from django.http import HttpRequest, JsonResponse

from core.errors import Unavailable

logger = logging.getLogger("core.db_recovery")

T = TypeVar("T")

CODE = "database_unavailable"
MESSAGE = "The database is unavailable; retry shortly."

# SQLSTATE classes of a server that is gone or not accepting connections: connection
# exceptions (08), and shutdown / crash / starting up (57P01-57P03). A query error
# (a deadlock, a cancelled statement, a constraint) is not an outage.
_UNAVAILABLE_SQLSTATES = ("08", "57P")


class DatabaseUnavailable(Unavailable):
    """The database cannot be reached: 503 with ``Retry-After``."""

    code = CODE

    def __init__(self, message: str = MESSAGE) -> None:
        super().__init__(message)

    @property
    def retry_after(self) -> int:
        return int(settings.DATABASE_RETRY_AFTER)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and what it was raised from (its cause, else its context), each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_database_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) says the server is unreachable."""
    for link in _chain(exc):
        if isinstance(link, DatabaseUnavailable):
            return True
        if isinstance(link, InterfaceError | psycopg.InterfaceError):
            return True  # "connection already closed"
        if isinstance(link, psycopg.OperationalError):
            sqlstate = link.sqlstate
            return sqlstate is None or sqlstate.startswith(_UNAVAILABLE_SQLSTATES)
        if isinstance(link, OperationalError) and link.__cause__ is None:
            return True
    return False


class StatementTimeout(Unavailable):
    """A statement ran past the web process's ``API_STATEMENT_TIMEOUT_SECONDS`` (or was
    cancelled): 503, the request changed nothing (its transaction rolled back)."""

    code = "statement_timeout"


def as_statement_timeout(exc: BaseException) -> StatementTimeout | None:
    """``StatementTimeout`` for a statement PostgreSQL cancelled (SQLSTATE 57014); None
    for anything else."""
    if not any(isinstance(link, psycopg.errors.QueryCanceled) for link in _chain(exc)):
        return None
    seconds = settings.API_STATEMENT_TIMEOUT_SECONDS
    return StatementTimeout(
        f"The request needed the database longer than the API allows ({seconds:g} s a "
        "statement) and was stopped; nothing changed. Narrow it (a smaller scope, "
        "limit or filter), or run it as background work."
    )


def as_database_unavailable(exc: BaseException) -> DatabaseUnavailable | None:
    """``DatabaseUnavailable`` for an outage error (and start the embedded server
    again); None for anything else."""
    if not is_database_unavailable(exc):
        return None
    request_embedded_restart()
    return exc if isinstance(exc, DatabaseUnavailable) else DatabaseUnavailable()


def unavailable_response(request: HttpRequest, exc: Unavailable) -> JsonResponse:
    """The 503 for code outside DRF (plain Django views, middleware, the 500 handler)."""
    from core.api.errors import error_body, openai_error_body

    if request.path.startswith("/v1/"):
        body = openai_error_body(503, exc.code, str(exc))
    else:
        body = error_body(exc.code, str(exc))
    response = JsonResponse(body, status=503)
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def response_for_current_exception(request: HttpRequest) -> JsonResponse | None:
    """Inside Django's 500 handler: the 503 if the request failed on an outage."""
    exc = sys.exc_info()[1]
    if exc is None:
        return None
    unavailable = as_database_unavailable(exc) or as_statement_timeout(exc)
    return unavailable_response(request, unavailable) if unavailable else None


def read_after_commit(read: Callable[[], T], fallback: Callable[[], T]) -> T:
    """``read()``, the fresh state of a write that already committed; if the database
    went away in between, ``fallback()`` (built from what the write returned). The
    write succeeded and must answer so: a client told 503 would send it again."""
    try:
        return read()
    except DatabaseError as exc:
        if not is_database_unavailable(exc):
            raise
        logger.warning("committed, but could not read it back: %s", exc)
        return fallback()


def refresh_after_commit(instance: models.Model) -> None:
    """Reload ``instance`` after its write committed; if the database went away in
    between, keep the values in memory (``read_after_commit``)."""
    read_after_commit(instance.refresh_from_db, lambda: None)


# --- embedded server restart -----------------------------------------------------------
_restart_guard = threading.Lock()
_restart_thread: threading.Thread | None = None


def embedded_server_running() -> bool:
    from core.embedded_pg import postmaster_running

    return postmaster_running(settings.DATA_DIR / "pgdata")


def ensure_embedded_running() -> bool:
    """Start the embedded server if it is not running (a no-op with ``DATABASE_URL``).

    Returns whether it had to be started. Safe from many processes at once.
    """
    if not settings.EMBEDDED_DATABASE or embedded_server_running():
        return False
    from core.embedded_pg import ensure_embedded_postgres

    started = time.monotonic()
    logger.warning("the embedded database is not running; starting it again")
    ensure_embedded_postgres(settings.DATA_DIR, **settings.EMBEDDED_DB_OPTIONS)
    logger.warning("embedded database running again (%.1fs)", time.monotonic() - started)
    return True


def _restart_loop(deadline: float) -> None:
    delay = 0.2
    while time.monotonic() < deadline:
        try:
            ensure_embedded_running()
            return
        except Exception:  # noqa: BLE001 - e.g. old backends still hold the shared memory
            logger.exception("could not start the embedded database yet")
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def request_embedded_restart(timeout: float = 60.0) -> None:
    """Start the embedded server again in the background (once per process at a time)."""
    global _restart_thread
    if not settings.EMBEDDED_DATABASE:
        return
    with _restart_guard:
        if _restart_thread is not None and _restart_thread.is_alive():
            return
        _restart_thread = threading.Thread(
            target=_restart_loop,
            args=(time.monotonic() + timeout,),
            name="embedded-db-restart",
            daemon=True,
        )
        _restart_thread.start()


def watch_embedded(min_interval: float = 1.0) -> Any:
    """A periodic callback for the supervisors: restart the server when it is down."""
    last = [0.0]

    def check() -> None:
        now = time.monotonic()
        if now - last[0] < min_interval:
            return
        last[0] = now
        try:
            ensure_embedded_running()
        except Exception:  # noqa: BLE001 - tried again next second
            logger.exception("could not start the embedded database yet")

    return check
