"""``manage.py flush`` empties the tables and starts owner ids again at 1: the journals
kept under an owner's id were then the next owner's (an operator's audit read the last
owner's journal through the new owner's key). Now they go with the tables."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from memories.engine import files
from tests.memories.engine.scripted import engine_storage  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
AT = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)


def _journal(owner_id: int) -> None:
    files.journal_append(owner_id=owner_id, scope=["user", "alice"], at=AT, source="api",
                         messages=[{"role": "user", "content": "I moved to Porto"}])  # fmt: skip
    files.write_text(files.memory_md_path(owner_id, ["user", "alice"]), "# Memory\n- Porto\n")


def test_a_flush_that_resets_ids_deletes_the_owners_files(engine_storage):  # noqa: F811
    owner = User.objects.create_user("first")
    _journal(owner.pk)
    assert sorted(p.name for p in engine_storage.rglob("*.md")) == ["2026-11-20.md", "MEMORY.md"]
    call_command("flush", interactive=False, verbosity=0)
    assert list(engine_storage.rglob("*.md")) == []
    newcomer = User.objects.create_user("second")
    assert newcomer.pk == owner.pk  # (the id the files were kept under)
    assert files.journal_days(owner_id=newcomer.pk, scope=["user", "alice"]) == []


def test_a_flush_that_keeps_the_ids_keeps_the_files(engine_storage):  # noqa: F811
    """(The test harness's own flush: ids are not reused, nothing to leak.)"""
    owner = User.objects.create_user("first")
    _journal(owner.pk)
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False)
    assert len(list(engine_storage.rglob("*.md"))) == 2
