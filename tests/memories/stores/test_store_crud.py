"""``POST``/``PATCH /api/v1/memory-stores`` load what they save: a store that cannot load
(an unset ``${VAR}``, the embedding endpoint failing) is refused with nothing written, and
the call can simply be made again. Also the knowledge bases' mismatch check, which leaves
the file stores' own indexes to the stores' check."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks

from knowledge.checks import knowledge_base_embedding_mismatch
from knowledge.models import Chunk, KnowledgeBase
from memories.stores.models import MemoryStore
from tests.fakes.openai_server import Scripted
from tests.knowledge.factories import make_kb
from tests.memories.stores.conftest import snapshot_db

pytestmark = pytest.mark.django_db
URL = "/api/v1/memory-stores"


def file_store(base_url: str, key: str = "${DOCS_KEY}") -> dict:
    return {
        "name": "docs",
        "type": "file",
        "config": {
            "file_sources": [{"path": "docs", "file_types": [".md"]}],
            "embedding": {
                "provider": "openai",
                "model": "text-embedding-3-small",
                "api_key": key,
                "base_url": base_url,
            },
        },
    }


def everything() -> dict:
    """The stores' rows plus the knowledge bases and chunks a file store owns."""
    return {
        **snapshot_db(),
        "bases": list(KnowledgeBase.objects.order_by("pk").values()),
        "chunks": list(Chunk.objects.order_by("pk").values_list("pk", "knowledge_base_id")),
    }


def embedding_calls(server) -> int:
    return len([r for r in server.requests if r["path"].endswith("/embeddings")])


def test_create_with_an_unset_variable_is_a_503_with_nothing_written_then_a_retry_works(
    alice_client, docs_root, embed_server, monkeypatch
):
    monkeypatch.delenv("DOCS_KEY", raising=False)
    before = everything()
    refused = alice_client.post(URL, file_store(embed_server.base_url), format="json")
    assert refused.status_code == 503
    assert refused.json()["error"] == {
        "code": "missing_environment_variable",
        "message": "environment variable DOCS_KEY is not set (referenced by a memory store)",
        "details": {"variable": "DOCS_KEY"},
    }
    assert everything() == before
    assert embedding_calls(embed_server) == 0

    monkeypatch.setenv("DOCS_KEY", "sk-docs")
    created = alice_client.post(URL, file_store(embed_server.base_url), format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["load"] == {
        "added": 2,
        "updated": 0,
        "unchanged": 0,
        "deleted": 0,
        "skipped": 0,
        "chunks_written": 2,
    }
    assert body["items"] == 2
    store = MemoryStore.objects.get(pk=body["id"])
    assert store.config["embedding"]["api_key"] == "${DOCS_KEY}"  # never stored resolved
    calls = [r for r in embed_server.requests if r["path"].endswith("/embeddings")]
    assert {r["headers"]["authorization"] for r in calls} == {"Bearer sk-docs"}


def test_create_whose_load_fails_takes_the_store_back(alice_client, docs_root, embed_server):
    embed_server.push(Scripted(status=400, body={"error": {"message": "bad model"}}))
    before = everything()
    failed = alice_client.post(URL, file_store(embed_server.base_url, "${API_KEY}"), format="json")
    # The endpoint's own 400, passed on as an upstream error (not a 409 name_taken).
    assert (failed.status_code, failed.json()["error"]["code"]) == (400, "upstream_error")
    assert embedding_calls(embed_server) == 1  # the load was tried, then taken back
    assert everything() == before

    again = alice_client.post(URL, file_store(embed_server.base_url, "${API_KEY}"), format="json")
    assert again.status_code == 201, again.json()
    assert again.json()["load"]["added"] == 2


def test_update_with_an_unset_variable_changes_nothing_then_a_retry_works(
    alice_client, docs_root, embed_server, monkeypatch
):
    created = alice_client.post(URL, file_store(embed_server.base_url, "${API_KEY}"), format="json")
    assert created.status_code == 201, created.json()
    url = f"{URL}/{created.json()['id']}"
    patch = {"config": file_store(embed_server.base_url, "${NEW_KEY}")["config"]}
    patch["config"]["file_sources"][0]["file_types"] = [".md", ".mdx"]
    monkeypatch.delenv("NEW_KEY", raising=False)
    before, calls = everything(), embedding_calls(embed_server)

    refused = alice_client.patch(url, patch, format="json")
    assert refused.status_code == 503
    assert refused.json()["error"]["details"] == {"variable": "NEW_KEY"}
    assert everything() == before
    assert embedding_calls(embed_server) == calls

    monkeypatch.setenv("NEW_KEY", "sk-new")
    patched = alice_client.patch(url, patch, format="json")
    assert patched.status_code == 200, patched.json()
    assert patched.json()["load"]["added"] == 1  # guide/onboarding.mdx
    assert patched.json()["config"]["embedding"]["api_key"] == "${NEW_KEY}"
    assert patched.json()["items"] == 3


def test_update_whose_load_fails_restores_the_previous_config(
    alice_client, docs_root, embed_server
):
    created = alice_client.post(URL, file_store(embed_server.base_url, "${API_KEY}"), format="json")
    url = f"{URL}/{created.json()['id']}"
    patch = {"config": file_store(embed_server.base_url, "${API_KEY}")["config"]}
    patch["config"]["file_sources"][0]["file_types"] = [".md", ".mdx"]
    embed_server.push(Scripted(status=400, body={"error": {"message": "bad model"}}))
    before = everything()
    failed = alice_client.patch(url, patch, format="json")
    assert (failed.status_code, failed.json()["error"]["code"]) == (400, "upstream_error")
    assert everything() == before

    patched = alice_client.patch(url, patch, format="json")
    assert patched.status_code == 200, patched.json()
    assert patched.json()["load"]["added"] == 1


# --- the knowledge bases' embedding check ----------------------------------------------
def test_knowledge_check_leaves_file_store_indexes_to_the_store_check(
    alice, alice_client, docs_root, embed_server, settings
):
    own = alice_client.post(URL, file_store(embed_server.base_url, "${API_KEY}"), format="json")
    assert own.status_code == 201, own.json()
    default = alice_client.post(
        URL,
        {
            "name": "docs-default",
            "type": "file",
            "config": {"file_sources": [{"path": "docs", "file_types": [".md"]}]},
        },
        format="json",
    )
    assert default.status_code == 201, default.json()
    # Its own embedding (openai, 1536) is not the service's default (hashing, 384): the
    # store asked for it, nothing to warn about.
    assert knowledge_base_embedding_mismatch(None) == []
    assert [m.id for m in run_checks() if m.id in ("core.W002", "memory_stores.W001")] == []

    make_kb(alice)  # a knowledge base of the API, with the default (hashing-v1, 384)
    settings.EMBEDDING_MODEL = "another-model"
    warnings = knowledge_base_embedding_mismatch(None)
    assert [w.id for w in warnings] == ["core.W002"]  # the plain base only, once
    assert "hashing/hashing-v1 (384 dims)" in warnings[0].msg
    stores = [m for m in run_checks() if m.id == "memory_stores.W001"]
    assert [w.msg.split(" embeds")[0] for w in stores] == ["Memory store 'docs-default' of 'alice'"]
