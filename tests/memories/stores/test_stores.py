"""Store behaviour: a custom type registered from outside the app, blackboard trimming by
count and age, the simple store's recency fallback and summaries, environment
references, the in-process manager and the embedding check."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ObjectDoesNotExist
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework import serializers

from memories.stores import search as store_search
from memories.stores.backends.base import (
    RetrieveQuery,
    StoreBackend,
    StoreHit,
    WriteIn,
    WriteResult,
)
from memories.stores.config import memory_config_apply
from memories.stores.manager import MemoryManager
from memories.stores.models import MemoryItem, MemoryStore
from memories.stores.registry import (
    StoreTypeError,
    StrictConfig,
    register_memory_store,
    unregister_memory_store,
)
from memories.stores.runtime import node_memory_retrieve, node_memory_write
from memories.stores.text import key_content, turn_summary
from tests.factories import UserFactory
from tests.memories.stores.conftest import snapshot_db

pytestmark = pytest.mark.django_db
URL = "/api/v1/memory-config"


# --- a custom type, registered from outside the app ----------------------------------
class KeywordConfig(StrictConfig):
    keywords = serializers.ListField(child=serializers.CharField(), allow_empty=False)


class KeywordStore(StoreBackend):
    """Keeps outputs that mention one of its keywords; finds them by shared words."""

    def update(self, write: WriteIn, prepared: Any) -> WriteResult:
        text = write.output.text
        if not any(k in text.lower() for k in self.config["keywords"]):
            return WriteResult("skipped", reason="no keyword")
        item = MemoryItem.objects.create(store=self.store, content_summary=text)
        return WriteResult("added", item_id=item.pk)

    def retrieve(self, query: RetrieveQuery) -> list[StoreHit]:
        def words(text: str) -> list[str]:
            return re.findall(r"\w+", text.lower())

        wanted = set(words(query.text))
        hits = [
            StoreHit(id=str(i.pk), content=i.content_summary, score=1.0)
            for i in MemoryItem.objects.filter(store=self.store).order_by("id")
            if wanted & set(words(i.content_summary))
        ]
        return hits[: query.top_k]


@pytest.fixture
def keyword_type():
    kind = register_memory_store(
        "keyword", config_cls=KeywordConfig, factory=KeywordStore, summary="Keyword notes."
    )
    yield kind
    unregister_memory_store("keyword")


def test_custom_type_end_to_end(keyword_type, alice_client, flow):
    with pytest.raises(StoreTypeError, match="'keyword' is already registered"):
        register_memory_store(
            "keyword", config_cls=KeywordConfig, factory=KeywordStore, summary="again"
        )
    listed = alice_client.get("/api/v1/memory-store-types").json()["results"]
    keyword = next(t for t in listed if t["name"] == "keyword")
    assert keyword["summary"] == "Keyword notes."
    assert keyword["config_fields"] == [
        {"name": "keywords", "required": True, "type": "list", "items": "string"}
    ]
    bad = {"memory": [{"name": "kw", "type": "keyword", "config": {"keywords": []}}]}
    assert list(alice_client.post(URL, bad, format="json").json()["error"]["details"]) == [
        "memory[0].config.keywords"
    ]
    doc = {
        "memory": [{"name": "kw", "type": "keyword", "config": {"keywords": ["deadline"]}}],
        "nodes": [{"id": "planner", "flow": flow.name, "memories": [{"name": "kw"}]}],
    }
    assert alice_client.post(URL, doc, format="json").status_code == 200
    node = f"/api/v1/flows/{flow.pk}/nodes/planner/memory"
    first = alice_client.post(
        f"{node}/write", {"input": "When?", "output": "The deadline is Friday."}, format="json"
    )
    assert first.json()["results"] == [
        {
            "store": "kw",
            "type": "keyword",
            "action": "added",
            "item_id": MemoryItem.objects.get().pk,
            "reason": "",
            "trimmed": 0,
        }
    ]
    second = alice_client.post(
        f"{node}/write", {"input": "Lunch?", "output": "Pizza."}, format="json"
    )
    assert second.json()["results"][0]["action"] == "skipped"
    found = alice_client.post(
        f"{node}/retrieve", {"stage": "pre", "query": "what deadline?"}, format="json"
    ).json()
    assert found["prompt"] == (
        "===== Related Memories =====\n\n--- kw ---\n1. The deadline is Friday.\n\n"
        "===== End of Memory ====="
    )


# --- blackboard -----------------------------------------------------------------------
def test_blackboard_trims_by_count_and_by_age(alice_client, flow):
    doc = {
        "memory": [
            {"name": "log", "type": "blackboard", "config": {"max_items": 3, "max_age": "1h"}}
        ],
        "nodes": [{"id": "worker", "flow": flow.name, "memories": [{"name": "log", "top_k": 10}]}],
    }
    assert alice_client.post(URL, doc, format="json").status_code == 200
    node = f"/api/v1/flows/{flow.pk}/nodes/worker/memory"
    for n in range(5):
        response = alice_client.post(
            f"{node}/write", {"input": f"step {n}", "output": f"done {n}"}, format="json"
        )
        assert response.json()["results"][0]["trimmed"] == (1 if n >= 3 else 0)
    store = MemoryStore.objects.get(name="log")
    kept = list(
        MemoryItem.objects.filter(store=store)
        .order_by("id")
        .values_list("content_summary", flat=True)
    )
    assert kept == [f"Input: step {n} Output: done {n}" for n in (2, 3, 4)]
    # One entry ages past max_age: retrieval leaves it out at once, the next write drops it.
    old = MemoryItem.objects.filter(store=store).order_by("id").first()
    MemoryItem.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=2))
    hits = alice_client.post(f"{node}/retrieve", {"stage": "gen", "query": ""}, format="json")
    assert [h["content"] for h in hits.json()["stores"][0]["hits"]] == [
        "Input: step 4 Output: done 4",
        "Input: step 3 Output: done 3",
    ]
    assert MemoryItem.objects.filter(pk=old.pk).exists()
    response = alice_client.post(f"{node}/write", {"input": "", "output": "done 5"}, format="json")
    assert response.json()["results"][0]["trimmed"] == 1
    assert not MemoryItem.objects.filter(pk=old.pk).exists()
    assert MemoryItem.objects.filter(store=store).count() == 3


def test_a_max_age_past_100_years_is_a_400_and_a_stored_one_breaks_no_node(alice_client, flow):
    """A new user's audit: "1000000w" was taken and then failed every read and write of
    its node (now - age: an OverflowError), and "99999999999999999d" was a 500 on create;
    3600, as the docs write it, was refused as no string."""
    stores = "/api/v1/memory-stores"
    for age in ("1000000w", "99999999999999999d", "36501d"):
        refused = alice_client.post(stores, {"name": "log", "type": "blackboard",
                                             "config": {"max_age": age}}, format="json")  # fmt: skip
        assert refused.status_code == 400, (age, refused.content)
        assert "config.max_age" in refused.json()["error"]["message"]
    assert not MemoryStore.objects.exists()
    made = alice_client.post(stores, {"name": "log", "type": "blackboard",
                                      "config": {"max_age": 3600}}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    assert MemoryStore.objects.get().config["max_age"] == "3600"
    doc = {
        "memory": [{"name": "log", "type": "blackboard", "config": {"max_age": "3600"}},
                   {"name": "notes", "type": "blackboard", "config": {}}],
        "nodes": [{"id": "worker", "flow": flow.name,
                   "memories": [{"name": "log"}, {"name": "notes"}]}],
    }  # fmt: skip
    assert alice_client.post(URL, doc, format="json").status_code == 200
    # One stored before the bound: read as the longest age, the node works.
    log = MemoryStore.objects.get(name="log")
    MemoryStore.objects.filter(pk=log.pk).update(config={**log.config, "max_age": "1000000w"})
    node = f"/api/v1/flows/{flow.pk}/nodes/worker/memory"
    wrote = alice_client.post(f"{node}/write", {"input": "q", "output": "done 1"}, format="json")
    assert wrote.status_code == 200, wrote.content
    found = alice_client.post(f"{node}/retrieve", {"stage": "gen", "query": ""}, format="json")
    assert found.status_code == 200, found.content
    assert [len(s["hits"]) for s in found.json()["stores"]] == [1, 1]


def test_a_callers_metadata_cannot_forge_the_services_keys(alice_client, flow):
    doc = {
        "memory": [{"name": "log", "type": "blackboard", "config": {}},
                   {"name": "plain", "type": "simple",
                    "config": {"embedding": {"provider": "none"}}}],
        "nodes": [{"id": "n1", "flow": flow.name,
                   "memories": [{"name": "log"}, {"name": "plain"}]}],
    }  # fmt: skip
    assert alice_client.post(URL, doc, format="json").status_code == 200
    forged = {"input_preview": "FORGED", "attachments": "FORGED", "content_length": -5,
              "team": "ops"}  # fmt: skip
    wrote = alice_client.post(f"/api/v1/flows/{flow.pk}/nodes/n1/memory/write",
                              {"input": "What plan am I on?", "output": "You are on the team plan since May.",
                               "metadata": forged}, format="json")  # fmt: skip
    assert wrote.status_code == 200, wrote.content
    items = {i.store.name: i.metadata for i in MemoryItem.objects.select_related("store")}
    assert {name: (m["team"], m["attachments"] == "FORGED") for name, m in items.items()} == {
        "log": ("ops", False), "plain": ("ops", False),
    }  # fmt: skip
    assert items["plain"]["input_preview"] == "What plan am I on?"
    assert items["plain"]["content_length"] > 0


# --- simple store details --------------------------------------------------------------
def test_simple_store_without_embedder_searches_by_keyword(alice_client, flow):
    """Without an embedder a simple store ranks by BM25 over its items; a query without
    words gives its newest items (no score)."""
    doc = {
        "memory": [
            {"name": "plain", "type": "simple", "config": {"embedding": {"provider": "none"}}}
        ],
        "nodes": [{"id": "n1", "flow": flow.name, "memories": [{"name": "plain", "top_k": 2}]}],
    }
    assert alice_client.post(URL, doc, format="json").status_code == 200
    node = f"/api/v1/flows/{flow.pk}/nodes/n1/memory"
    for n in range(3):
        alice_client.post(
            f"{node}/write",
            {"input": f"question {n}", "output": f"The answer number {n} is written down here."},
            format="json",
        )
    assert not MemoryItem.objects.filter(embedding__isnull=False).exists()
    hits = alice_client.post(
        f"{node}/retrieve", {"stage": "gen", "query": "answer 0"}, format="json"
    ).json()["stores"][0]["hits"]
    # "0" is rarer than "answer" (every item's): item 0 first, then the tie by id.
    assert [h["content"].split(" Output")[0] for h in hits] == [
        "Input: question 0",
        "Input: question 1",
    ]
    assert hits[0]["score"] > hits[1]["score"] > 0 and hits[0]["similarity"] is None
    hits = alice_client.post(
        f"{node}/retrieve", {"stage": "gen", "query": "?!"}, format="json"
    ).json()["stores"][0]["hits"]
    assert [h["content"].split(" Output")[0] for h in hits] == [
        "Input: question 2",
        "Input: question 1",
    ]
    assert hits[0]["score"] is None


def test_summary_and_key_content():
    long_answer = (
        "You are a helpful assistant, answer briefly. Deploy with docker compose after the "
        "migrations. Then start the worker so background jobs run. Finally check /healthz "
        "for the worker heartbeat. Ignore the rest of this paragraph entirely please."
    )
    summary = turn_summary("How do I deploy?", long_answer, max_chars=500)
    assert summary == (
        "Input: How do I deploy? Output: Deploy with docker compose after the migrations. "
        "Then start the worker so background jobs run. Finally check /healthz for the "
        "worker heartbeat."
    )
    capped = key_content("word " * 400, max_chars=100)
    assert len(capped) <= 101 and capped.endswith("…")


# --- environment references -----------------------------------------------------------
def test_missing_environment_variable_names_the_store_and_writes_nothing(
    alice_client, flow, openai_server, monkeypatch
):
    monkeypatch.setenv("STORE_KEY", "sk-1")
    doc = {
        "memory": [
            {
                "name": "remote",
                "type": "simple",
                "config": {
                    "embedding": {
                        "provider": "openai",
                        "model": "tiny",
                        "api_key": "${STORE_KEY}",
                        "base_url": openai_server.base_url,
                        "params": {"dimensions": 8},
                    }
                },
            }
        ],
        "nodes": [{"id": "n1", "flow": flow.name, "memories": [{"name": "remote"}]}],
    }
    assert alice_client.post(URL, doc, format="json").status_code == 200
    monkeypatch.delenv("STORE_KEY")
    before = snapshot_db()
    response = alice_client.post(
        f"/api/v1/flows/{flow.pk}/nodes/n1/memory/write",
        {"input": "q", "output": "A long enough answer to be remembered."},
        format="json",
    )
    # The store fails alone (issue 26): named in errors, the node's answer a 200.
    assert response.status_code == 200
    assert response.json() == {"results": [], "errors": [{
        "store": "remote", "type": "simple", "code": "missing_environment_variable",
        "message": "environment variable STORE_KEY is not set (referenced by a memory store)",
    }]}  # fmt: skip
    assert snapshot_db() == before
    assert not [r for r in openai_server.requests if r["path"].endswith("/embeddings")]


# --- in process -----------------------------------------------------------------------
def test_manager_load_retrieve_update_save(alice, alice_client, flow, docs_root):
    doc = {
        "memory": [
            {"name": "notes", "type": "simple", "config": {}},
            {
                "name": "docs",
                "type": "file",
                "config": {"file_sources": [{"path": "docs", "file_types": [".md"]}]},
            },
        ],
        "nodes": [
            {
                "id": "answer",
                "flow": flow.name,
                "memories": [{"name": "notes"}, {"name": "docs", "write": False}],
            },
        ],
    }
    assert alice_client.post(URL, doc, format="json").status_code == 200
    manager = MemoryManager.for_node(owner=alice, flow=str(flow.pk), node_id="answer")
    assert manager.load() == {
        "docs": {
            "added": 0,
            "updated": 0,
            "unchanged": 2,
            "deleted": 0,
            "skipped": 0,
            "chunks_written": 0,
        }
    }
    (docs_root / "docs" / "billing.md").unlink()
    (docs_root / "docs" / "deploy.md").write_text("Deploys now go through the blue-green pipeline.")
    assert manager.load()["docs"] == {
        "added": 0,
        "updated": 1,
        "unchanged": 0,
        "deleted": 1,
        "skipped": 0,
        "chunks_written": 1,
    }
    written = manager.update(input="How do deploys work?", output="Deploys go blue-green now.")
    assert {name: r.action for name, r in written.items()} == {"notes": "added"}
    manager.save()
    result = manager.retrieve(stage="gen", query="how do deploys work")
    assert [g.store for g in result.stores] == ["notes", "docs"]
    assert result.stores[1].hits[0].content == "Deploys now go through the blue-green pipeline."
    assert result.prompt.startswith("===== Related Memories =====\n\n--- notes ---\n1. Input:")
    with pytest.raises(ObjectDoesNotExist):  # another owner's flow: a 404 over HTTP
        MemoryManager.for_node(owner=UserFactory(username="eve"), flow=flow, node_id="answer")


def test_check_warns_when_the_default_embedding_moved(alice_client, settings):
    alice_client.post("/api/v1/memory-stores", {"name": "notes", "type": "simple"}, format="json")
    assert not [m for m in run_checks() if m.id == "memory_stores.W001"]
    settings.EMBEDDING_MODEL = "another-model"
    warnings = [m for m in run_checks() if m.id == "memory_stores.W001"]
    assert len(warnings) == 1
    # (named with its owner: two owners' stores of one name read alike)
    assert (
        "Memory store 'notes' of 'alice' embeds with hashing/hashing-v1 (384 dims)"
        in warnings[0].msg
    )


def test_large_stores_search_through_the_hnsw_index(alice, flow, monkeypatch):
    memory_config_apply(
        owner=alice,
        document={
            "memory": [{"name": "big", "type": "simple", "config": {}}],
            "nodes": [{"id": "n", "flow": flow.name, "memories": [{"name": "big", "top_k": 3}]}],
        },
    )
    topics = ["deploy", "invoice", "mentor", "weather", "museum", "database", "schedule"]
    for n, topic in enumerate(topics * 3):
        node_memory_write(
            flow=flow,
            node_id="n",
            input=f"question {n} about {topic}",
            output=f"The answer {n} is all about the {topic} topic.",
        )
    assert set(MemoryItem.objects.values_list("dimensions", flat=True)) == {384}

    def hits() -> list[tuple[str, float]]:
        result = node_memory_retrieve(flow=flow, node_id="n", stage="gen", query="deploy topic")
        return [(h.id, round(h.similarity or 0, 6)) for h in result.stores[0].hits]

    exact = hits()
    monkeypatch.setattr(store_search, "ITEMS", replace(store_search.ITEMS, exact_max=5))
    with CaptureQueriesContext(connection) as queries:
        indexed = hits()  # 21 items: the index path
    assert any("/* vector leg, filtered */" in q["sql"] for q in queries.captured_queries)
    assert indexed == exact
    assert all("deploy" in MemoryItem.objects.get(pk=i).content_summary for i, _ in exact)
