"""The docs' in-process Python blocks, run as written in this process (the test database),
with the names their pages say they are given (``user``: a Django user; ``flow_id``: one
of its flows' id), then checked against what they wrote."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import pytest

from memories.conversations.services import flow_create
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_list
from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryItem
from memories.stores.registry import StoreTypeError, store_type, unregister_memory_store
from tests.readme import run_block

pytestmark = pytest.mark.django_db


def _run(run_id: str, **given: Any) -> dict[str, Any]:
    block = run_block(run_id)
    assert block.language == "python"
    namespace: dict[str, Any] = {"__name__": "docs", **given}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block.text, block.where, "exec"), namespace)
    return namespace


def _facts(owner, *scope: str) -> list[tuple[str, str, float]]:
    row = scope_find(owner=owner, scope=scope)
    if row is None:
        return []
    return sorted((f.content, f.category, f.confidence) for f in fact_list(scope=row))


def engine_python(alice) -> None:
    ran = _run("engine-python", user=alice)
    assert ran["added"].action == "add"
    assert _facts(alice, "memories", "alice") == [
        ("User lives in Lisbon", "context", 1.0),
        ("User prefers dark mode", "preference", 0.8),
    ]


def tools_python(alice) -> None:
    ran = _run("tools-python", user=alice)
    assert [h["content"] for h in ran["hits"]] == ["User prefers dark mode"]
    assert _facts(alice, "user", "alice") == []  # created, updated, then deleted
    assert callable(ran["retrieve_node_memory"]) and callable(ran["write_node_memory"])


def stores_custom_type(alice) -> None:
    try:
        _run("stores-custom-type")
        notes = store_type("notes")
        assert notes is not None and notes.summary == "Notes"
        with pytest.raises(StoreTypeError):  # a name registered twice raises
            _run("stores-custom-type")
    finally:
        unregister_memory_store("notes")


def stores_manager(alice) -> None:
    flow = flow_create(owner=alice, name="docs-bot")
    memory_config_apply(owner=alice, document={
        "memory": [{"name": "convo_cache", "type": "simple"}],
        "nodes": [{"id": "answer", "flow": "docs-bot", "memories": [{"name": "convo_cache"}]}],
    })  # fmt: skip
    ran = _run("stores-manager", user=alice, flow_id=str(flow.pk))
    assert ran["block"] == ""  # nothing remembered before this turn
    assert list(MemoryItem.objects.values_list("content_summary", flat=True)) == [
        "Input: Which port does it use? Output: It listens on port 8000 by default."
    ]


IN_PROCESS: dict[str, Callable[[Any], None]] = {
    "engine-python": engine_python,
    "tools-python": tools_python,
    "stores-custom-type": stores_custom_type,
    "stores-manager": stores_manager,
}


@pytest.mark.parametrize("run_id", sorted(IN_PROCESS))
def test_the_block_runs_as_written(run_id, alice):
    IN_PROCESS[run_id](alice)
