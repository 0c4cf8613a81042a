"""A scope erased while its extraction waits on the LLM: the run writes nothing of it
afterwards (no journal day, no MEMORY.md, no fact, run record or retry schedule), the
erasure does not wait for the LLM, and another scope's run is untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django_q.models import Schedule

from core.models import UsageDay
from ingestion.updates import updates_run
from memories.engine import files
from memories.engine.dreams import memory_md_sync
from memories.engine.models import FormationRun, PendingUpdate
from memories.engine.updates import schedule_name, update_record
from memories.facts.models import Fact, Scope
from memories.facts.scopes import scope_ensure
from memories.facts.services import scope_erase
from tests.fakes.openai_server import Scripted, chat_body
from tests.memories.engine.scripted import fact

pytestmark = pytest.mark.django_db(transaction=True)
SAID = "I collect quince stamps"
ANSWERS = {
    "facts": Scripted(body=chat_body(json.dumps({"newFacts": [fact("User collects stamps")]}))),
    "malformed": Scripted(body=chat_body("no JSON here, ever")),
    "provider_error": Scripted(status=400, body={"error": {"message": "bad request"}}),
}


def _erase_then(answer: Scripted, scope_id: int):
    """The LLM: the scope is erased (another connection: a request beside the run)
    while the extraction waits, then the extraction is answered."""

    def respond(payload: dict[str, Any]) -> Scripted:
        for scope in Scope.objects.filter(pk=scope_id):
            scope_erase(scope=scope)
        connection.close()
        return answer

    return respond


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_a_run_whose_scope_is_erased_during_its_extraction_writes_nothing(
    alice, llm_settings, openai_server, engine_storage, settings, answer
):
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 30
    row = scope_ensure(owner=alice, scope=("user", "jr1"))
    update_record(owner=alice, scope=row, messages=[{"role": "user", "content": SAID}])
    openai_server.chat_fn = _erase_then(ANSWERS[answer], row.pk)

    run = updates_run(scope_id=row.pk, force=True)

    assert run.status == "empty" and run.journal_entries == 0
    assert not Scope.objects.filter(pk=row.pk).exists()
    assert (Fact.objects.count(), PendingUpdate.objects.count(), FormationRun.objects.count(),
            Schedule.objects.filter(name=schedule_name(row.pk)).count()) == (0, 0, 0, 0)  # fmt: skip
    assert _files(engine_storage) == []  # no journal day, no MEMORY.md of the erased scope
    # The LLM call, counted after the erasure, is the owner's, about no one named.
    assert set(UsageDay.objects.values_list("subject", flat=True)) <= {"(erased)"}


def test_a_run_whose_scope_is_kept_writes_its_journal(
    alice, llm_settings, openai_server, engine_storage, settings
):
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 30
    row = scope_ensure(owner=alice, scope=("user", "jr2"))
    update_record(owner=alice, scope=row, messages=[{"role": "user", "content": SAID}])
    openai_server.chat_fn = lambda payload: ANSWERS["facts"]

    run = updates_run(scope_id=row.pk, force=True)

    assert run.status == "done" and run.journal_entries == 1
    day = _files(engine_storage)
    assert day == sorted([files.memory_md_path(alice.pk, ["user", "jr2"]),
                          *[f for f in day if f.startswith("journal/")]])  # fmt: skip
    assert len(day) == 2 and SAID in (engine_storage / day[0]).read_text()


def test_memory_md_of_a_scope_erased_since_it_was_read_is_not_written(alice, engine_storage):
    row = scope_ensure(owner=alice, scope=("user", "jr3"))
    scope_erase(scope=Scope.objects.get(pk=row.pk))
    memory_md_sync(row)  # (a run or a read that found the scope before the erasure)
    assert _files(engine_storage) == []


def test_an_inferred_add_whose_scope_is_erased_during_its_extraction_is_a_404(
    alice, llm_settings, openai_server, engine_storage
):
    """``infer: true`` (``updates_now``) read its flush back after the run, and the
    erasure had deleted it: a 500 (PendingUpdate.DoesNotExist)."""
    from ingestion.updates import updates_now
    from memories.facts.selectors import ScopeNotFound

    row = scope_ensure(owner=alice, scope=("user", "jr2"))
    openai_server.chat_fn = _erase_then(ANSWERS["facts"], row.pk)
    with pytest.raises(ScopeNotFound):
        updates_now(owner=alice, scope=row, messages=[{"role": "user", "content": SAID}])
    assert not Scope.objects.filter(pk=row.pk).exists()
    assert (Fact.objects.count(), PendingUpdate.objects.count()) == (0, 0)
    assert _files(engine_storage) == []
