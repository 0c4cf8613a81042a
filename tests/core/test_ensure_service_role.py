"""``manage.py ensure_service_role``: the service's role made by the tables' owner on an
external PostgreSQL (docker-compose's ``migrate`` runs it first)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from core.db_backend.base import table_owner

ROLE = "memory_app_ensure_test"


def _role(name: str) -> tuple | None:
    with table_owner(connection), connection.cursor() as cur:
        cur.execute(
            "SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, "
            "rolpassword IS NOT NULL FROM pg_authid WHERE rolname = %s",
            [name],
        )
        return cur.fetchone()


def _run() -> str:
    out = io.StringIO()
    call_command("ensure_service_role", stdout=out)
    return out.getvalue().strip()


@pytest.fixture
def new_role(monkeypatch):
    """The database entry naming a role that does not exist yet (dropped afterwards)."""
    monkeypatch.setitem(connection.settings_dict, "USER", ROLE)
    monkeypatch.setitem(connection.settings_dict, "PASSWORD", "s3cret'; DROP ROLE x; --")
    yield ROLE
    with table_owner(connection), connection.cursor() as cur:
        cur.execute(f"DROP ROLE IF EXISTS {ROLE}")


@pytest.mark.django_db(transaction=True)
def test_the_service_role_is_made_once_with_no_power_beyond_logging_in(new_role):
    assert _role(new_role) is None
    assert _run() == f"role {new_role} created"
    # It logs in with a password; no superuser, no database or role creation, no bypass
    assert _role(new_role) == (True, False, False, False, False, True)
    with table_owner(connection), connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_class WHERE relowner = %s::regrole", [new_role])
        assert cur.fetchone() == (0,)  # owns nothing
    assert _run() == f"role {new_role} exists"
    assert _role(new_role) == (True, False, False, False, False, True)


@pytest.mark.django_db(transaction=True)
def test_the_embedded_databases_role_exists_and_is_left_as_it_is():
    before = _role("memory_app")
    assert _run() == "role memory_app exists"
    assert _role("memory_app") == before


@pytest.mark.django_db(transaction=True)
def test_without_an_owner_url_there_is_nothing_to_make():
    with pytest.MonkeyPatch.context() as mp:  # (undone before the role is looked up)
        mp.delitem(connection.settings_dict, "OWNER_USER")
        mp.setitem(connection.settings_dict, "USER", ROLE)
        assert _run() == "no DATABASE_OWNER_URL: the service's role owns the tables"
    connection.close()
    assert _role(ROLE) is None


def test_an_unknown_database_alias_is_one_line():
    """``--database nosuch`` was a ConnectionDoesNotExist traceback."""
    with pytest.raises(CommandError, match=r"^--database: no database 'nosuch' \(known: "):
        call_command("ensure_service_role", "--database", "nosuch")
