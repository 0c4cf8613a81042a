"""MemoryEngine.flush and .dream in process; without an LLM both are the 503 naming
LLM_BASE_URL and write nothing, while the rest of the engine works."""

from __future__ import annotations

import pytest

from core.providers.errors import ProviderNotConfigured
from ingestion.updates import updates_run
from memories.engine.facade import MemoryEngine
from memories.engine.models import Dream, PendingUpdate
from tests.memories.engine.scripted import EngineLLM, fact

pytestmark = pytest.mark.django_db


def test_flush_and_dream_in_process(alice, llm_settings, openai_server, engine_storage):
    openai_server.chat_fn = EngineLLM(
        {"I am vegetarian": [fact("User is vegetarian", "preference", 0.95)]},
        dream=lambda prompt: {"facts": [{"id": None, "content": "User is vegetarian",
                                         "category": "preference", "confidence": 0.97}],
                              "diary": "kept"},
    )  # fmt: skip
    engine = MemoryEngine(owner=alice, values={"user_id": "alice"})
    update = engine.flush(["user", "{user_id}"], [{"role": "user", "content": "I am vegetarian"}])
    assert (update.status, update.source, update.scope.path) == (
        "pending",
        "engine",
        ["user", "alice"],
    )
    updates_run(scope_id=update.scope_id, force=True)
    assert [h.content for h in engine.search(["user", "alice"], "vegetarian").hits] == [
        "User is vegetarian"
    ]
    outcome = engine.dream(["user", "{user_id}"], lookback_days=1)
    assert not outcome.skipped and outcome.dream.scope.path == ["user", "alice"]
    assert engine.dream(["user", "alice"], lookback_days=1).skipped


def test_without_an_llm(alice, settings, engine_storage):
    settings.LLM_BASE_URL = ""
    engine = MemoryEngine(owner=alice)
    for call in (lambda: engine.flush(["user", "alice"], [{"role": "user", "content": "hi"}]),
                 lambda: engine.dream(["user", "alice"])):  # fmt: skip
        with pytest.raises(ProviderNotConfigured) as err:
            call()
        assert err.value.status_code == 503 and err.value.details == {"variable": "LLM_BASE_URL"}
    assert PendingUpdate.objects.count() == 0 and Dream.objects.count() == 0
    assert engine.manage(["user", "alice"], "User likes tea").action == "add"
    assert "User likes tea" in engine.format_for_injection(["user", "alice"], 100).text
