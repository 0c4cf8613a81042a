"""Over HTTP, end to end: the seed's sample config (a simple store and a file store over a
real directory of .md files) plus a blackboard on one node; written turns, retrieval per
stage, the block, dedup, thresholds, the read-only refusal and tenancy."""

from __future__ import annotations

import json
import re

import pytest

from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore
from tests.memories.stores.conftest import seed_config, snapshot_db

pytestmark = pytest.mark.django_db

TURNS = [
    (
        "How do I deploy the service?",
        "Deploy with docker compose: run the migrations first, then start web and worker.",
    ),
    (
        "When are invoices sent to customers?",
        "Invoices go out on the first day of each month; refunds take five business days.",
    ),
    (
        "Who mentors the new engineers?",
        "Every new engineer gets a mentor and pairs on the support queue in the first week.",
    ),
]


def node_url(flow, node: str = "answer") -> str:
    return f"/api/v1/flows/{flow.pk}/nodes/{node}/memory"


def write(client, flow, inp, out, node: str = "answer", **extra):
    return client.post(
        f"{node_url(flow, node)}/write", {"input": inp, "output": out, **extra}, format="json"
    )


def retrieve(client, flow, stage: str, query: str, node: str = "answer", **extra):
    return client.post(
        f"{node_url(flow, node)}/retrieve", {"stage": stage, "query": query, **extra}, format="json"
    )


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def expected_block(stores: list[dict]) -> str:
    lines = ["===== Related Memories ====="]
    for group in stores:
        lines.append(f"\n--- {group['store']} ---")
        lines += [f"{i}. {_one_line(h['content'])}" for i, h in enumerate(group["hits"], 1)]
    lines.append("\n===== End of Memory =====")
    return "\n".join(lines)


@pytest.fixture
def configured(alice_client, flow, docs_root, embed_server):
    response = alice_client.post(
        "/api/v1/memory-config", seed_config(embed_server.base_url), format="json"
    )
    assert response.status_code == 200, response.json()
    return response.json()


def test_seed_config_applies_and_indexes_the_files(configured, embed_server, alice):
    assert configured["changed"] is True
    assert [(c["kind"], c["action"], c["store"]) for c in configured["changes"]] == [
        ("store", "create", "convo_cache"),
        ("store", "create", "project_docs"),
        ("store", "create", "board"),
        ("attachment", "create", "convo_cache"),
        ("attachment", "create", "project_docs"),
        ("attachment", "create", "board"),
    ]
    # deploy.md, billing.md and guide/onboarding.mdx (one chunk each); notes.txt is filtered.
    assert configured["loads"] == {
        "project_docs": {
            "added": 3,
            "updated": 0,
            "unchanged": 0,
            "deleted": 0,
            "skipped": 0,
            "chunks_written": 3,
        }
    }
    stores = {s.name: s for s in MemoryStore.objects.filter(owner=alice)}
    assert stores["convo_cache"].embedding_provider == "openai"
    assert stores["convo_cache"].embedding_model == "text-embedding-3-small"
    assert stores["convo_cache"].embedding_dimensions == 1536
    assert stores["board"].embedding_provider == ""
    # The key went out resolved, and is stored only as the reference.
    embed_calls = [r for r in embed_server.requests if r["path"].endswith("/embeddings")]
    assert embed_calls and all(
        r["headers"]["authorization"] == "Bearer sk-from-env" for r in embed_calls
    )
    stored = json.dumps([s.config for s in stores.values()])
    assert "sk-from-env" not in stored
    assert stores["project_docs"].config["embedding"]["api_key"] == "${API_KEY}"


def test_three_turns_retrieval_by_stage_block_and_dedup(configured, alice_client, flow):
    item_ids = []
    for number, (question, answer) in enumerate(TURNS, 1):
        response = write(alice_client, flow, question, answer, session_id="s1")
        assert response.status_code == 200, response.json()
        results = response.json()["results"]
        assert [(r["store"], r["type"], r["action"]) for r in results] == [
            ("convo_cache", "simple", "added"),
            ("board", "blackboard", "added"),
        ]
        assert results[1]["trimmed"] == (1 if number == 3 else 0)  # board keeps 2
        item_ids.append(results[0]["item_id"])
    assert MemoryItem.objects.filter(store__name="convo_cache").count() == 3
    assert MemoryItem.objects.filter(store__name="board").count() == 2

    response = retrieve(alice_client, flow, "gen", "How do we deploy with docker compose?")
    assert response.status_code == 200
    body = response.json()
    assert [(s["store"], s["type"]) for s in body["stores"]] == [
        ("convo_cache", "simple"),
        ("project_docs", "file"),
        ("board", "blackboard"),
    ]
    convo, docs, board = body["stores"]
    # top_k 5 and threshold -1: all three turns, the deploy turn first.
    assert [h["id"] for h in convo["hits"]][0] == str(item_ids[0])
    assert sorted(h["id"] for h in convo["hits"]) == sorted(str(i) for i in item_ids)
    assert convo["hits"][0]["content"].startswith("Input: How do I deploy the service? Output:")
    scores = [h["score"] for h in convo["hits"]]
    assert scores == sorted(scores, reverse=True)
    # The file store's own ranking: deploy.md first, the default top_k of 3.
    assert docs["hits"][0]["metadata"]["file_path"].endswith("docs/deploy.md")
    assert len(docs["hits"]) == 3
    # The blackboard: the newest two entries, newest first.
    assert [h["content"].split(" Output:")[0] for h in board["hits"]] == [
        "Input: Who mentors the new engineers?",
        "Input: When are invoices sent to customers?",
    ]
    assert body["prompt"] == expected_block(body["stores"])
    assert body["truncated"] == 0
    assert body["token_count"] <= body["max_tokens"]

    # "plan" is outside convo_cache's and board's stages: the file store alone answers.
    plan = retrieve(alice_client, flow, "plan", "How do we deploy?").json()
    assert [s["store"] for s in plan["stores"]] == ["project_docs"]
    assert plan["prompt"].startswith("===== Related Memories =====\n\n--- project_docs ---\n1. ")
    critique = retrieve(alice_client, flow, "critique", "deploy").json()
    assert [s["store"] for s in critique["stores"]] == ["project_docs", "board"]

    # The same turn again: a duplicate for the simple store, appended to the board.
    again = write(alice_client, flow, *TURNS[0]).json()["results"]
    assert [(r["store"], r["action"], r["item_id"]) for r in again[:1]] == [
        ("convo_cache", "duplicate", item_ids[0])
    ]
    assert again[1]["action"] == "added"
    assert MemoryItem.objects.filter(store__name="convo_cache").count() == 3


def test_block_stays_within_max_tokens(configured, alice_client, flow):
    for question, answer in TURNS:
        write(alice_client, flow, question, answer)
    full = retrieve(alice_client, flow, "gen", "deploy docker compose").json()
    small = retrieve(alice_client, flow, "gen", "deploy docker compose", max_tokens=120).json()
    assert full["token_count"] > 120
    assert 0 < small["token_count"] <= 120
    left_out = sum(len(g["hits"]) - g["in_prompt"] for g in small["stores"])
    assert small["truncated"] == left_out > 0  # a count, as a history's
    # What fits is each store's best items, in the store's order.
    for group_full, group_small in zip(full["stores"], small["stores"]):
        kept = group_small["in_prompt"]
        assert [h["id"] for h in group_small["hits"]] == [h["id"] for h in group_full["hits"]]
        prefix = group_full["hits"][:kept]
        for i, hit in enumerate(prefix, 1):
            assert f"{i}. {_one_line(hit['content'])}" in small["prompt"]


def test_skipped_and_snapshot_writes(configured, alice_client, flow):
    results = write(alice_client, flow, "hi", "ok").json()["results"]
    assert [(r["store"], r["action"], r["reason"]) for r in results] == [
        ("convo_cache", "skipped", "output shorter than 20 characters"),
        ("board", "added", ""),
    ]
    snapshot = {
        "text": "Here is the architecture diagram you asked for, with the queue in the middle.",
        "blocks": [
            {"type": "text", "text": "Here is the architecture diagram."},
            {"type": "image", "data": "aGVsbG8=", "name": "arch.png", "mime_type": "image/png"},
            {"type": "file", "url": "s3://bucket/spec.pdf", "name": "spec.pdf"},
        ],
    }
    results = write(alice_client, flow, "Draw the architecture", snapshot).json()["results"]
    item = MemoryItem.objects.get(pk=results[0]["item_id"])
    assert item.output_snapshot["blocks"][1] == {
        "type": "image",
        "name": "arch.png",
        "mime_type": "image/png",
        "data": "aGVsbG8=",
        "size": 5,
        "sha256": "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
    }
    assert item.metadata["attachments"] == [
        {"type": "image", "name": "arch.png", "mime_type": "image/png", "size": 5},
        {"type": "file", "name": "spec.pdf", "url": "s3://bucket/spec.pdf"},
    ]
    before = snapshot_db()
    bad = write(alice_client, flow, "x", {"text": "y", "blocks": [{"type": "image"}]})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"].startswith("output.blocks[0]:")
    assert snapshot_db() == before


def test_threshold_minus_one_against_half(alice_client, flow, docs_root, embed_server):
    config = seed_config(embed_server.base_url)
    config["nodes"] = [
        {"id": "loose", "flow": flow.name, "memories": [{"name": "convo_cache", "top_k": 5}]},
        {
            "id": "strict",
            "flow": flow.name,
            "memories": [{"name": "convo_cache", "top_k": 5, "similarity_threshold": 0.5}],
        },
    ]
    assert alice_client.post("/api/v1/memory-config", config, format="json").status_code == 200
    for question, answer in TURNS:
        write(alice_client, flow, question, answer, node="loose")
    query = TURNS[1][1]  # the invoices answer, word for word
    loose = retrieve(alice_client, flow, "gen", query, node="loose").json()["stores"][0]["hits"]
    strict = retrieve(alice_client, flow, "gen", query, node="strict").json()["stores"][0]["hits"]
    assert len(loose) == 3
    assert [h["id"] for h in strict] == [h["id"] for h in loose if h["similarity"] >= 0.5]
    assert 1 <= len(strict) < 3
    assert "invoices" in strict[0]["content"].lower()


def test_read_only_store_refuses_writes_and_item_deletes(configured, alice_client, flow, alice):
    before = snapshot_db()
    config = seed_config("http://127.0.0.1:9/v1")
    config["nodes"][0]["memories"][1]["write"] = True
    response = alice_client.post("/api/v1/memory-config", config, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_config"
    assert error["details"] == {
        "nodes[0].memories[1].write": ["store 'project_docs' is read-only: set write: false"]
    }
    assert snapshot_db() == before
    docs = MemoryStore.objects.get(owner=alice, name="project_docs")
    refused = alice_client.delete(f"/api/v1/memory-stores/{docs.pk}/items/1")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "read_only"


def test_items_browse_delete_and_store_delete(configured, alice_client, flow, alice):
    for question, answer in TURNS:
        write(alice_client, flow, question, answer, session_id="s-1")
    convo = MemoryStore.objects.get(owner=alice, name="convo_cache")
    listed = alice_client.get("/api/v1/memory-stores").json()
    assert [(s["name"], s["items"], s["read_only"]) for s in listed["results"]] == [
        ("board", 2, False),
        ("convo_cache", 3, False),
        ("project_docs", 3, True),
    ]
    items = alice_client.get(f"/api/v1/memory-stores/{convo.pk}/items?session_id=s-1").json()
    assert items["count"] == 3
    assert "embedding" not in items["results"][0]
    newest = items["results"][0]["id"]
    assert (
        alice_client.delete(f"/api/v1/memory-stores/{convo.pk}/items/{newest}").status_code == 204
    )
    assert MemoryItem.objects.filter(store=convo).count() == 2
    gone = alice_client.delete(f"/api/v1/memory-stores/{convo.pk}/items/{newest}")
    assert gone.status_code == 404

    docs = MemoryStore.objects.get(owner=alice, name="project_docs")
    kb_id = docs.knowledge_base_id
    assert alice_client.delete(f"/api/v1/memory-stores/{convo.pk}").status_code == 204
    assert alice_client.delete(f"/api/v1/memory-stores/{docs.pk}").status_code == 204
    assert not MemoryItem.objects.filter(store_id=convo.pk).exists()
    assert list(
        MemoryAttachment.objects.filter(flow=flow).values_list("store__name", flat=True)
    ) == ["board"]
    assert alice_client.get(f"/api/v1/knowledge-bases/{kb_id}").status_code == 404


def test_tenancy(configured, alice_client, bob_client, anon_client, flow, alice):
    write(alice_client, flow, *TURNS[0])
    convo = MemoryStore.objects.get(owner=alice, name="convo_cache")
    item = MemoryItem.objects.filter(store=convo).first()
    before = snapshot_db()
    store_url = f"/api/v1/memory-stores/{convo.pk}"
    for response in (
        bob_client.get(store_url),
        bob_client.patch(store_url, {"config": {"max_items": 1}}, format="json"),
        bob_client.delete(store_url),
        bob_client.get(f"{store_url}/items"),
        bob_client.delete(f"{store_url}/items/{item.pk}"),
        bob_client.post(f"{store_url}/load"),
        retrieve(bob_client, flow, "gen", "deploy"),
        write(bob_client, flow, "How do I deploy?", "With docker compose, as always done."),
        bob_client.get(node_url(flow)),
        # alice's flow, a node without attachments
        retrieve(alice_client, flow, "gen", "deploy", node="nobody"),
        write(alice_client, flow, "a question here", "an answer long enough", node="nobody"),
    ):
        assert response.status_code == 404, response.json()
        assert response.json()["error"]["code"] == "not_found"
    # bob's config cannot name alice's flow, by name or id
    for ref in (flow.name, str(flow.pk)):
        doc = {"nodes": [{"id": "answer", "flow": ref, "memories": []}]}
        refused = bob_client.post("/api/v1/memory-config", doc, format="json")
        assert refused.status_code == 400
        assert list(refused.json()["error"]["details"]) == ["nodes[0].flow"]
    assert bob_client.get("/api/v1/memory-stores").json()["count"] == 0
    assert bob_client.get("/api/v1/memory-config").json() == {"memory": [], "nodes": []}
    assert anon_client.get("/api/v1/memory-stores").status_code == 401
    assert anon_client.post("/api/v1/memory-config", {}, format="json").status_code == 401
    assert snapshot_db() == before


def test_a_file_store_index_cannot_be_deleted_on_its_own(configured, alice_client, alice):
    docs = MemoryStore.objects.get(owner=alice, name="project_docs")
    response = alice_client.delete(f"/api/v1/knowledge-bases/{docs.knowledge_base_id}")
    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "in_use",
        "message": "knowledge base 'memory-store:project_docs' belongs to memory store "
        "project_docs; delete that instead",
        "details": None,
    }
    docs.refresh_from_db()
    assert docs.knowledge_base.chunk_count == 3


def test_schema_lists_the_endpoints(client):
    schema = client.get("/api/schema/").content
    for path in (
        b"/api/v1/memory-config:",
        b"/api/v1/memory-store-types:",
        b"/api/v1/memory-stores/{store_id}/items/{item_id}:",
        b"/api/v1/flows/{flow_id}/nodes/{node_id}/memory/retrieve:",
        b"/api/v1/flows/{flow_id}/nodes/{node_id}/memory/write:",
    ):
        assert path in schema


def test_patching_file_sources_reindexes(configured, alice_client, alice):
    docs = MemoryStore.objects.get(owner=alice, name="project_docs")
    config = {**docs.config, "file_sources": [{"path": "docs/guide", "file_types": [".mdx"]}]}
    response = alice_client.patch(
        f"/api/v1/memory-stores/{docs.pk}", {"config": config}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["load"] == {
        "added": 0,
        "updated": 0,
        "unchanged": 1,
        "deleted": 2,
        "skipped": 0,
        "chunks_written": 0,
    }
    assert response.json()["items"] == 1


def test_a_file_stores_items_are_its_files_chunks(configured, alice_client):
    store = MemoryStore.objects.get(name="project_docs")
    listed = alice_client.get(f"/api/v1/memory-stores/{store.pk}/items").json()
    shown = alice_client.get(f"/api/v1/memory-stores/{store.pk}").json()["items"]
    assert listed["count"] == shown == 3  # the count the store reports, browsable
    paths = [item["metadata"]["file_path"] for item in listed["results"]]
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["billing.md", "deploy.md", "onboarding.mdx"]
    first = listed["results"][0]
    assert first["content_summary"] and first["metadata"]["chunk_index"] == 0
    one = alice_client.get(f"/api/v1/memory-stores/{store.pk}/items/{first['id']}")
    assert one.status_code == 200 and one.json() == first
    refused = alice_client.delete(f"/api/v1/memory-stores/{store.pk}/items/{first['id']}")
    assert refused.status_code == 409  # read-only: its files are the source
    assert alice_client.get(f"/api/v1/memory-stores/{store.pk}/items").json()["count"] == 3
