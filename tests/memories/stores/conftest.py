"""Fixtures for memory stores: a directory of .md files under an allowed root, an
OpenAI-compatible fake that embeds with the hashing embedder, and the seed's config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.providers.embeddings import HashingEmbedder
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore

DOCS = {
    "deploy.md": "# Deploying\n\nThe service is deployed with docker compose. Run migrations "
    "first, then start the web and worker containers. Rolling back means restoring the "
    "previous image tag.",
    "billing.md": "# Billing\n\nInvoices are sent on the first day of each month. Refunds are "
    "processed within five business days by the finance team.",
    "guide/onboarding.mdx": "# Onboarding\n\nNew engineers get a laptop, an API key and a "
    "mentor. The first week is spent pairing on the support queue.",
    "notes.txt": "This text file is not indexed: its suffix is not listed.",
}


@pytest.fixture
def docs_root(tmp_path: Path, settings) -> Path:
    root = (tmp_path / "allowed").resolve()
    for name, text in DOCS.items():
        path = root / "docs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    settings.MEMORY_STORE_FILE_ROOTS = [str(root)]
    return root


@pytest.fixture
def embed_server(openai_server, monkeypatch):
    """The fake OpenAI endpoint embeds with the hashing embedder at the model's size
    (text-embedding-3-small: 1536), and ${API_KEY} is set."""
    embedders: dict[int, HashingEmbedder] = {}

    def embed(texts: list[str]) -> list[list[float]]:
        dims = 1536
        embedder = embedders.setdefault(dims, HashingEmbedder(dimensions=dims))
        return embedder.embed(texts).tolist()

    openai_server.embed_fn = embed
    monkeypatch.setenv("API_KEY", "sk-from-env")
    return openai_server


def seed_config(base_url: str, flow: str = "support-bot") -> dict[str, Any]:
    """The seed's sample (a simple and a file store on OpenAI embeddings) plus a
    blackboard, all attached to the node ``answer``."""
    embedding = {
        "provider": "openai",
        "model": "text-embedding-3-small",
        "api_key": "${API_KEY}",
        "base_url": base_url,
    }
    return {
        "memory": [
            {
                "name": "convo_cache",
                "type": "simple",
                "config": {"memory_path": "WareHouse/shared/simple.json", "embedding": embedding},
            },
            {
                "name": "project_docs",
                "type": "file",
                "config": {
                    "index_path": "WareHouse/index/project_docs.json",
                    "file_sources": [
                        {"path": "docs/", "file_types": [".md", ".mdx"], "recursive": True}
                    ],
                    "embedding": embedding,
                },
            },
            {"name": "board", "type": "blackboard", "config": {"max_items": 2}},
        ],
        "nodes": [
            {
                "id": "answer",
                "flow": flow,
                "memories": [
                    {
                        "name": "convo_cache",
                        "retrieve_stage": ["gen"],
                        "top_k": 5,
                        "read": True,
                        "write": True,
                    },
                    {"name": "project_docs", "read": True, "write": False},
                    {"name": "board", "retrieve_stage": ["gen", "critique"], "top_k": 2},
                ],
            }
        ],
    }


def snapshot_db() -> dict[str, list]:
    """Every store, item and attachment row, to assert that nothing changed."""
    return {
        "stores": list(MemoryStore.objects.order_by("pk").values()),
        "items": list(
            MemoryItem.objects.order_by("pk").values_list("pk", "store_id", "summary_hash")
        ),
        "attachments": list(MemoryAttachment.objects.order_by("pk").values()),
    }
