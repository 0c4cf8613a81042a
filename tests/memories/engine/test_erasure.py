"""Erasing a scope leaves nothing of it: facts and audit, pending updates and their run
schedule, dreams, conversation summaries (rows), journal days, MEMORY.md and dream
diaries (files). Other scopes, nested ones and other owners' keep theirs."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import transaction
from django_q.models import Schedule

from memories.conversations.models import ConversationSummary
from memories.conversations.summaries import scope_conversation_key
from memories.engine import files
from memories.engine.dreams import memory_md_read
from memories.engine.models import Dream, PendingUpdate
from memories.engine.updates import schedule_name, update_record
from memories.facts.models import Fact, FactChange, FactLink, Scope
from memories.facts.scopes import scope_ensure
from memories.facts.services import FactIn, fact_add

pytestmark = pytest.mark.django_db(transaction=True)
AT = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _storage(engine_storage, fixture_embedder, settings):
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 30  # pending updates wait on a schedule
    return engine_storage


def _fill(owner, scope: tuple[str, ...], fact: str) -> Scope:
    """Everything the engine keeps of a scope: a fact, a pending update (and its
    schedule), a dream, a conversation summary, a journal day, MEMORY.md, a diary."""
    row = scope_ensure(owner=owner, scope=scope)
    fact_add(owner=owner, scope=row, facts=[FactIn(fact, confidence=0.9)])
    update_record(
        owner=owner, scope=row, messages=[{"role": "user", "content": fact}], require_llm=False
    )
    Dream.objects.create(owner=owner, scope=row, lookback_days=1, input_hash="x" * 64,
                         files_written=True)  # fmt: skip
    ConversationSummary.objects.create(
        owner=owner, key=scope_conversation_key(list(scope), "c1"), text="summary of " + fact
    )
    files.journal_append(
        owner_id=owner.pk, scope=list(scope), messages=[{"role": "user", "content": fact}],
        at=AT, source="api",
    )  # fmt: skip
    memory_md_read(row)  # written on read
    files.write_text(files.diary_path(owner.pk, list(scope), AT.date()), "# Dream\n" + fact)
    return row


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _left_of(row_id: int, owner_id: int, scope: list[str]) -> dict[str, int]:
    prefix = scope_conversation_key(scope, "")
    return {
        "scope": Scope.objects.filter(pk=row_id).count(),
        "facts": Fact.objects.filter(scope_id=row_id).count(),
        "links": FactLink.objects.filter(scope_id=row_id).count(),
        "audit": FactChange.objects.filter(scope_id=row_id).count(),
        "pending": PendingUpdate.objects.filter(scope_id=row_id).count(),
        "schedule": Schedule.objects.filter(name=schedule_name(row_id)).count(),
        "dreams": Dream.objects.filter(scope_id=row_id).count(),
        "summaries": ConversationSummary.objects.filter(
            owner_id=owner_id, key__startswith=prefix
        ).count(),
    }


NOTHING = dict.fromkeys(
    ("scope", "facts", "links", "audit", "pending", "schedule", "dreams", "summaries"), 0
)
ONE_EACH = {**NOTHING, "scope": 1, "facts": 1, "links": 1, "audit": 1, "pending": 1,
            "schedule": 1, "dreams": 1, "summaries": 1}  # fmt: skip


def test_erasing_an_end_user_removes_every_trace_of_the_scope(
    alice, bob, alice_client, engine_storage
):
    erased = _fill(alice, ("user", "u1"), "User plays the violin")
    other = _fill(alice, ("user", "u2"), "User works as a nurse")
    bobs = _fill(bob, ("user", "u1"), "User lives in New York")
    before = _files(engine_storage)
    mine = {f for f in before if f"/{alice.pk}/user/u1/" in f}
    assert len(mine) == 3  # journal day, MEMORY.md, diary
    response = alice_client.delete("/api/v1/users/u1/memories")
    assert response.status_code == 200
    assert response.json() == {"scope": ["user", "u1"], "facts_removed": 1, "deleted": 1}
    assert _left_of(erased.pk, alice.pk, ["user", "u1"]) == NOTHING
    assert _files(engine_storage) == before - mine
    # The scope's folders went too (their names hold the end user's id).
    assert not any(p.name == "u1" and p.parent.name == "user" and f"/{alice.pk}/" in str(p)
                   for p in engine_storage.rglob("*"))  # fmt: skip
    # Another end user of the owner, and another owner's "u1", keep everything.
    assert _left_of(other.pk, alice.pk, ["user", "u2"]) == ONE_EACH
    assert _left_of(bobs.pk, bob.pk, ["user", "u1"]) == ONE_EACH


def test_engine_erase_keeps_nested_and_other_scopes(
    alice, alice_client, bob_client, engine_storage
):
    org = _fill(alice, ("org", "acme"), "User prefers dark mode")
    bot = _fill(alice, ("org", "acme", "bot"), "User is allergic to peanuts")
    before = _files(engine_storage)
    # Another owner cannot erase it: 404, and nothing changes.
    refused = bob_client.post("/api/v1/engine/erase", {"scope": ["org", "acme"]}, format="json")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "scope_not_found"
    assert _left_of(org.pk, alice.pk, ["org", "acme"]) == ONE_EACH
    assert _files(engine_storage) == before
    response = alice_client.post("/api/v1/engine/erase", {"scope": ["org", "acme"]}, format="json")
    assert response.status_code == 200
    assert response.json() == {"scope": ["org", "acme"], "facts_removed": 1}
    assert _left_of(org.pk, alice.pk, ["org", "acme"]) == NOTHING
    left = _files(engine_storage)
    # Only the nested scope's files remain under the org's folders.
    assert left == {f for f in before if "/org/acme/bot/" in f}
    assert _left_of(bot.pk, alice.pk, ["org", "acme", "bot"]) == ONE_EACH
    # A bad body is a 400 and erases nothing.
    bad = alice_client.post("/api/v1/engine/erase", {"scope": []}, format="json")
    assert bad.status_code == 400
    assert _left_of(bot.pk, alice.pk, ["org", "acme", "bot"]) == ONE_EACH


def test_a_failed_erasure_keeps_rows_and_files(alice, engine_storage):
    from memories.facts.services import scope_erase

    row = _fill(alice, ("user", "u1"), "User plays the violin")
    row_id = row.pk  # (a deleted instance loses its pk, even when rolled back)
    before = _files(engine_storage)
    with pytest.raises(RuntimeError), transaction.atomic():
        scope_erase(scope=row)
        raise RuntimeError("the caller's transaction fails after the erasure")
    assert _left_of(row_id, alice.pk, ["user", "u1"]) == ONE_EACH
    assert _files(engine_storage) == before


@pytest.mark.parametrize("door", ["api", "schedule"])
def test_a_scope_erased_while_its_dream_waits_on_the_llm_gets_no_dream(
    alice, alice_client, llm_settings, openai_server, engine_storage, door
):
    """The erasure does not wait for the dream's LLM call; the dream then finds the scope
    gone: a 404 as if erased first (was a 500, the dream's row failing its scope's key at
    the commit), and neither the dream's row nor MEMORY.md nor a diary is written."""
    from django.db import connection

    from memories.engine.dreams import dream_scheduled
    from memories.facts.services import scope_erase
    from tests.fakes.openai_server import Scripted, chat_body

    row = _fill(alice, ("user", "u1"), "User plays the violin")
    Dream.objects.all().delete()  # (a dream to make: its inputs changed)
    files.storage().delete(files.memory_md_path(alice.pk, ["user", "u1"]))

    def erase_then_answer(payload: dict) -> Scripted:
        for scope in Scope.objects.filter(pk=row.pk):
            scope_erase(scope=scope)
        connection.close()
        kept = [{"id": fact_id, "content": "User plays the violin"} for fact_id in re.findall(
            r"\(id: ([^)]+)\)", json.dumps(payload))]  # fmt: skip
        return Scripted(body=chat_body(json.dumps({"facts": kept, "diary": "Nothing new."})))

    openai_server.chat_fn = erase_then_answer
    if door == "api":
        response = alice_client.post("/api/v1/engine/dream", {"scope": ["user", "u1"]},
                                     format="json")  # fmt: skip
        assert response.status_code == 404, response.content
        assert response.json()["error"]["code"] == "scope_not_found"
    else:
        assert dream_scheduled(scope_id=row.pk, day=AT.date()) == "gone"
    assert _left_of(row.pk, alice.pk, ["user", "u1"]) == NOTHING
    assert _files(engine_storage) == set()
