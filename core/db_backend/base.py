"""Django's PostgreSQL backend, which starts (or attaches to) the embedded server when a
process first connects, instead of when the settings are imported.

A database entry using it carries ``EMBEDDED: {"data_dir", "dbname", "server_settings"}``
(the arguments of ``core.embedded_pg.ensure_embedded_postgres``) and leaves ``HOST`` and
``PORT`` empty. The first connection of a process starts the server (or finds it
running: one server per data directory, shared by every process), creates ``dbname``,
applies the memory settings and runs the pgvector self-check, then writes the server's
socket directory and port into the entry, so every later reader of the settings (the
test database's creation, ``dbshell``, tests that connect with psycopg) sees where it
is. A process that never connects (``manage.py help``, ``makemigrations --check``
without a migration to check, mypy) never starts it.

A server that dies later is started again by ``core.db_recovery`` (same data
directory, so the same socket): the entry stays valid.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psycopg
from django.db.backends.postgresql import base, client, creation
from psycopg.pq import TransactionStatus

from core import tenancy
from core.embedded_pg import EmbeddedDatabaseMissing, ServerInfo, ensure_embedded_postgres

_lock = threading.Lock()
_servers: dict[tuple[Path, str], ServerInfo] = {}


class DatabaseMissing(psycopg.OperationalError):
    """The embedded server has no database of that name and this process makes none
    (``core.embedded_pg.for_command``): a connection error, as PostgreSQL's own "database
    does not exist" is, so what copes with a database it cannot reach (a system check,
    the worker's wait) copes with this one; Django raises it as its OperationalError."""


def embedded_server(settings_dict: dict[str, Any]) -> ServerInfo | None:
    """The embedded server of a database entry, started on the process's first call
    (None for an entry without ``EMBEDDED``); fills the entry's ``HOST`` and ``PORT``."""
    config = settings_dict.get("EMBEDDED")
    if not config:
        return None
    key = (Path(config["data_dir"]).resolve(), config["dbname"])
    with _lock:  # two threads' first connections start (and self-check) it once
        info = _servers.get(key)
        if info is None:
            try:
                info = ensure_embedded_postgres(
                    key[0], dbname=config["dbname"], server_settings=config.get("server_settings"),
                    service_role=config.get("service_role"),
                )  # fmt: skip
            except EmbeddedDatabaseMissing as exc:
                raise DatabaseMissing(str(exc)) from exc
            _servers[key] = info
    if not settings_dict.get("HOST"):  # a test may point the entry elsewhere on purpose
        settings_dict["HOST"] = info.socket_dir
        settings_dict["PORT"] = str(info.port)
    settings_dict["USER"] = settings_dict.get("USER") or info.user
    return info


# --- Row-level security: the owner settings of every transaction (core.tenancy) --------

_IDLE = TransactionStatus.IDLE
# The settings a connection's open transaction carries (absent: unknown, or none sent).
_applied: weakref.WeakKeyDictionary[psycopg.Connection[Any], tenancy.State] = (
    weakref.WeakKeyDictionary()
)
# Connections subject to the policies (made with the service's role, not the tables' owner).
_enforced: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()


def pending_settings(raw: psycopg.Connection[Any]) -> tenancy.State | None:
    """The owner settings to send before the next statement on ``raw`` (None: it carries
    them already, or needs none). A new transaction gets them unless it runs as nobody
    (the defaults, an empty or unknown ``memory.owner_id``, already say nobody); an open
    one when what it runs as changed since. Records them as sent: send them."""
    if raw not in _enforced:
        return None
    status = raw.info.transaction_status
    current = tenancy.state()
    if status == _IDLE:
        _applied[raw] = current
        return None if current == tenancy.NOBODY else current
    if status != TransactionStatus.INTRANS or _applied.get(raw) == current:
        return None
    _applied[raw] = current
    return current


def settings_literal(value: tenancy.State) -> str:
    """The statement setting ``OWNER_SETTINGS``, its values written in (an owner id is
    digits, the bypass ``on`` or empty), to go before a statement in one query string."""
    owner, on = tenancy.settings_params(value)
    if owner and not owner.isdigit():
        raise ValueError(f"not an owner id: {owner!r}")
    return (
        f"SELECT set_config('memory.owner_id', '{owner}', true), "
        f"set_config('memory.bypass', '{on}', true)"
    )


# Statements that read or write no owner's rows: sent as they are (some may not run in
# a transaction block, which a query string of two statements is). ROLLBACK TO
# SAVEPOINT among them undoes a set_config made after the savepoint: the settings are
# unknown after any of them, and sent again before the next statement that needs them.
_UTILITY = re.compile(
    r"\s*(VACUUM|ANALYZE|CREATE|DROP|ALTER|REINDEX|CLUSTER|CHECKPOINT|SET|RESET|SHOW|"
    r"DISCARD|LISTEN|UNLISTEN|NOTIFY|GRANT|REVOKE|SAVEPOINT|RELEASE|ROLLBACK|COMMIT|BEGIN)\b",
    re.IGNORECASE,
)


# (Django defines them for psycopg 3 only: untyped here)
_DjangoCursor: Any = base.Cursor  # type: ignore[attr-defined]
_DjangoServerSideCursor: Any = base.ServerSideCursor  # type: ignore[attr-defined]
_DjangoWrapper: Any = base.DatabaseWrapper


class TenantCursor(_DjangoCursor):
    """Django's cursor (client-side binding), sending the owner settings first where
    its statement needs them: in the same query string when it starts a transaction
    (one round trip; outside a transaction the two form one implicit transaction), by
    themselves before it inside an open one."""

    __slots__ = ()

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        raw = self.connection
        if raw not in _enforced:  # (the tables' owner: no policy holds for it)
            return super().execute(query, params, **kwargs)
        if isinstance(query, str) and _UTILITY.match(query):
            # Reads no owner's rows, and may not run in a transaction (VACUUM): as is.
            _applied.pop(raw, None)  # (unknown: it may start the transaction)
            return super().execute(query, params, **kwargs)
        value = pending_settings(raw)
        if value is None:
            return super().execute(query, params, **kwargs)
        if isinstance(query, str) and raw.info.transaction_status == _IDLE:
            super().execute(f"{settings_literal(value)}; {query}", params, **kwargs)
            self.nextset()  # the statement's own result
            return self
        with raw.transaction() if raw.autocommit else nullcontext():
            super().execute(settings_literal(value))
            return super().execute(query, params, **kwargs)

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        raw = self.connection
        value = pending_settings(raw)
        if value is None:
            return super().executemany(query, params_seq, **kwargs)
        with raw.transaction() if raw.autocommit else nullcontext():
            super().execute(settings_literal(value))
            super().executemany(query, params_seq, **kwargs)
        return None


class TenantServerSideCursor(_DjangoServerSideCursor):
    """A named cursor (``QuerySet.iterator()``): its ``DECLARE`` gets the settings
    before it in the same transaction (outside one, a transaction around both: the held
    cursor's rows are read under them at its commit)."""

    __slots__ = ()

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        raw = self.connection
        value = pending_settings(raw)
        if value is None:
            return super().execute(query, params, **kwargs)
        with raw.transaction() if raw.autocommit else nullcontext():
            with psycopg.ClientCursor(raw) as cur:
                cur.execute(settings_literal(value))
            return super().execute(query, params, **kwargs)


def row_security_enforced(settings_dict: dict[str, Any]) -> bool:
    """Whether connections of this entry are subject to the policies: they use the
    service's role, and another role (``OWNER_USER``) owns the tables."""
    owner = settings_dict.get("OWNER_USER")
    return bool(owner) and owner != settings_dict.get("USER")


@contextmanager
def table_owner(connection: Any) -> Iterator[None]:
    """Connect ``connection`` as the tables' owner for the block (migrations, the test
    database's creation, a flush), then as the service again; nothing changes for an
    entry without an ``OWNER_USER``. Only this wrapper's entry changes, not the
    settings other threads' connections read."""
    shared = connection.settings_dict
    if not row_security_enforced(shared):
        yield
        return
    connection.close()
    connection.settings_dict = {
        **shared, "USER": shared["OWNER_USER"], "PASSWORD": shared.get("OWNER_PASSWORD", ""),
        "SERVICE_USER": shared["USER"],
    }  # fmt: skip
    try:
        yield
    finally:
        connection.close()
        changed = {
            k: v for k, v in connection.settings_dict.items()
            if k not in ("USER", "PASSWORD", "SERVICE_USER")
        }  # fmt: skip
        shared.update(changed)  # (the test database's name, the embedded server's address)
        connection.settings_dict = shared


class DatabaseCreation(creation.DatabaseCreation):
    def create_test_db(self, *args: Any, **kwargs: Any) -> str:
        from core.row_security import secure_tables

        with table_owner(self.connection):
            name = super().create_test_db(*args, **kwargs)
            secure_tables(self.connection, service_role(self.connection))
        return name

    def destroy_test_db(self, *args: Any, **kwargs: Any) -> None:
        with table_owner(self.connection):
            super().destroy_test_db(*args, **kwargs)


def service_role(connection: Any) -> str | None:
    """The service's role while ``table_owner`` connects as the owner (None outside)."""
    return connection.settings_dict.get("SERVICE_USER")


class DatabaseClient(client.DatabaseClient):
    def runshell(self, parameters: Iterable[str]) -> None:
        embedded_server(self.connection.settings_dict)
        super().runshell(parameters)


class DatabaseWrapper(_DjangoWrapper):
    client_class = DatabaseClient
    creation_class = DatabaseCreation

    def get_connection_params(self) -> dict[str, Any]:
        embedded_server(self.settings_dict)
        params = super().get_connection_params()
        params["cursor_factory"] = TenantCursor
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        raw = super().get_new_connection(conn_params)
        if row_security_enforced(self.settings_dict):
            _enforced.add(raw)
        return raw

    # A transaction's end ends its settings: the next one sends them again, however it
    # starts (a statement on a cursor of psycopg's own would not look).
    def _commit(self) -> None:
        try:
            super()._commit()
        finally:
            self._settings_ended()

    def _rollback(self) -> None:
        try:
            super()._rollback()
        finally:
            self._settings_ended()

    def _set_autocommit(self, autocommit: bool) -> None:
        super()._set_autocommit(autocommit)
        self._settings_ended()

    def _settings_ended(self) -> None:
        if self.connection is not None:
            _applied.pop(self.connection, None)

    def create_cursor(self, name: str | None = None) -> Any:
        cursor = super().create_cursor(name)
        if name:  # Django's named cursor, with the settings sent before its DECLARE
            cursor.__class__ = TenantServerSideCursor
        return cursor
