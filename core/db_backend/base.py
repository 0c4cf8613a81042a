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

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.db.backends.postgresql import base, client

from core.embedded_pg import ServerInfo, ensure_embedded_postgres

_lock = threading.Lock()
_servers: dict[tuple[Path, str], ServerInfo] = {}


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
            info = ensure_embedded_postgres(
                key[0], dbname=config["dbname"], server_settings=config.get("server_settings")
            )
            _servers[key] = info
    if not settings_dict.get("HOST"):  # a test may point the entry elsewhere on purpose
        settings_dict["HOST"] = info.socket_dir
        settings_dict["PORT"] = str(info.port)
    settings_dict["USER"] = settings_dict.get("USER") or info.user
    return info


class DatabaseClient(client.DatabaseClient):
    def runshell(self, parameters: Iterable[str]) -> None:
        embedded_server(self.connection.settings_dict)
        super().runshell(parameters)


class DatabaseWrapper(base.DatabaseWrapper):
    client_class = DatabaseClient

    def get_connection_params(self) -> dict[str, Any]:
        embedded_server(self.settings_dict)
        return super().get_connection_params()
