"""Stores fail alone (issue 26): a store that cannot answer (here its embedding key is an
unset ``${VAR}``) is named in an ``errors`` entry, and the node's other stores answer and
are written as usual; never a 503 for the whole node."""

from __future__ import annotations

import pytest

from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryItem, MemoryStore
from memories.tools.registry import tool_call

pytestmark = pytest.mark.django_db
REMOTE = {"provider": "openai", "model": "text-embedding-3-small", "api_key": "${API_KEY}"}


@pytest.fixture
def node(alice, flow, embed_server):
    memory_config_apply(owner=alice, document={
        "memory": [
            {"name": "notes", "type": "simple", "config": {}},
            {"name": "remote", "type": "simple",
             "config": {"embedding": {**REMOTE, "base_url": embed_server.base_url}}},
        ],
        "nodes": [{"id": "answer", "flow": flow.name,
                   "memories": [{"name": "notes"}, {"name": "remote"}]}],
    })  # fmt: skip
    return f"/api/v1/flows/{flow.pk}/nodes/answer/memory"


def test_a_broken_store_is_named_and_the_others_answer(alice, flow, alice_client, node,
                                                       monkeypatch):  # fmt: skip
    turn = {"input": "Which plan am I on?", "output": "You are on the team plan since May."}
    written = alice_client.post(f"{node}/write", turn, format="json").json()
    assert [(r["store"], r["action"]) for r in written["results"]] == [
        ("notes", "added"), ("remote", "added"),
    ]  # fmt: skip
    assert written["errors"] == []
    notes_item = written["results"][0]["item_id"]
    monkeypatch.delenv("API_KEY")  # the remote store's key is gone
    found = alice_client.post(f"{node}/retrieve", {"stage": "gen", "query": "which plan"},
                              format="json")  # fmt: skip
    assert found.status_code == 200, found.content
    body = found.json()
    assert [s["store"] for s in body["stores"]] == ["notes"]
    assert "team plan" in body["prompt"]
    # A hit names its item as the write and the items API do: an integer item_id.
    [hit] = body["stores"][0]["hits"]
    assert (hit["item_id"], hit["id"]) == (notes_item, str(notes_item))
    [error] = body["errors"]
    assert (error["store"], error["type"], error["code"]) == (
        "remote", "simple", "missing_environment_variable",
    )  # fmt: skip
    assert "API_KEY" in error["message"]
    again = {"input": "And my seats?", "output": "Your plan has twelve seats in all."}
    written = alice_client.post(f"{node}/write", again, format="json")
    assert written.status_code == 200
    assert [r["store"] for r in written.json()["results"]] == ["notes"]
    assert [e["store"] for e in written.json()["errors"]] == ["remote"]
    counts = {s.name: MemoryItem.objects.filter(store=s).count() for s in MemoryStore.objects.all()}
    assert counts == {"notes": 2, "remote": 1}
    # The store is marked: in the API and in the admin (a column and a warning).
    problems = {
        s["name"]: s["problem"] for s in alice_client.get("/api/v1/memory-stores").json()["results"]
    }
    assert problems["notes"] is None and "API_KEY" in problems["remote"]
    # The tools answer the same.
    tool = tool_call(owner=alice, name="retrieve_node_memory", arguments={
        "flow": str(flow.pk), "node_id": "answer", "stage": "gen", "query": "seats"})  # fmt: skip
    assert [e["store"] for e in tool["errors"]] == ["remote"]
    assert [s["store"] for s in tool["stores"]] == ["notes"]


def test_a_store_that_cannot_load_is_refused_at_creation(alice_client, monkeypatch):
    monkeypatch.delenv("NEVER_SET_KEY", raising=False)
    config = {"embedding": {**REMOTE, "api_key": "${NEVER_SET_KEY}",
                            "base_url": "http://127.0.0.1:9/v1"}}  # fmt: skip
    response = alice_client.post("/api/v1/memory-stores",
                                 {"name": "broken", "type": "simple", "config": config},
                                 format="json")  # fmt: skip
    assert response.status_code in (400, 503), response.content
    assert "NEVER_SET_KEY" in response.json()["error"]["message"]
    assert not MemoryStore.objects.exists()


def test_the_admin_marks_a_store_that_cannot_answer(admin_client, node, monkeypatch):
    page = admin_client.get("/admin/memory_stores/memorystore/").content.decode()
    assert "⚠" not in page
    monkeypatch.delenv("API_KEY")
    page = admin_client.get("/admin/memory_stores/memorystore/").content.decode()
    assert "Memory store remote: environment variable API_KEY is not set" in page
    assert page.count("⚠") == 1
