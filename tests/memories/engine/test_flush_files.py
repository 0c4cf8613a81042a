"""``manage.py flush`` empties the tables and starts owner ids again at 1: the journals
kept under an owner's id were then the next owner's (an operator's audit read the last
owner's journal through the new owner's key). Now they go with the tables."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection

from memories.engine import files
from tests.memories.engine.scripted import engine_storage  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
AT = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)


@pytest.fixture
def sequences_kept():
    """The ids the test run reached, back (past what this test used) after the flush
    resets them: the run's later tests keep files of their own under owner ids (the
    run's flushes keep the ids), and an id given twice would find another test's."""
    from core.db_backend.base import table_owner

    with table_owner(connection), connection.cursor() as cur:
        cur.execute("SELECT schemaname || '.' || sequencename, last_value FROM pg_sequences "
                    "WHERE last_value IS NOT NULL")  # fmt: skip
        reached = cur.fetchall()
    yield
    with table_owner(connection), connection.cursor() as cur:
        for name, value in reached:
            cur.execute("SELECT setval(%s, greatest(%s + 100, (SELECT last_value FROM pg_sequences "
                        "WHERE schemaname || '.' || sequencename = %s)))",
                        [name, value, name])  # fmt: skip


def _journal(owner_id: int) -> None:
    files.journal_append(owner_id=owner_id, scope=["user", "alice"], at=AT, source="api",
                         messages=[{"role": "user", "content": "I moved to Porto"}])  # fmt: skip
    files.write_text(files.memory_md_path(owner_id, ["user", "alice"]), "# Memory\n- Porto\n")


def test_a_flush_that_resets_ids_deletes_the_owners_files(engine_storage, sequences_kept):  # noqa: F811
    owner = User.objects.create_user("first")
    for owner_id in {owner.pk, 1}:  # (1: the id the next owner gets, whatever ran before)
        _journal(owner_id)
    assert files.journal_days(owner_id=1, scope=["user", "alice"]) != []
    call_command("flush", interactive=False, verbosity=0)
    assert list(engine_storage.rglob("*.md")) == []
    newcomer = User.objects.create_user("second")
    assert newcomer.pk == 1  # (ids start again)
    assert files.journal_days(owner_id=newcomer.pk, scope=["user", "alice"]) == []


def test_a_flush_that_keeps_the_ids_keeps_the_files(engine_storage):  # noqa: F811
    """(The test harness's own flush: ids are not reused, nothing to leak.)"""
    owner = User.objects.create_user("first")
    _journal(owner.pk)
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False)
    assert len(list(engine_storage.rglob("*.md"))) == 2


def test_a_declined_flush_deletes_nothing(engine_storage, monkeypatch):  # noqa: F811
    """(It decided from "no user is left", which a declined flush of a database without
    users also met.)"""
    _journal(7)
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    call_command("flush", interactive=True, verbosity=0)
    assert len(list(engine_storage.rglob("*.md"))) == 2
