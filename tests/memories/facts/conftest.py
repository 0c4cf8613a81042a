from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.providers import embeddings

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "memory_embeddings.json"
VECTORS = json.loads(FIXTURE.read_text())["vectors"]


class FixtureEmbedder:
    """Pre-generated all-MiniLM-L6-v2 vectors (tests/fixtures/memory_embeddings.json).

    It reports the configured model name, so stored vectors match the settings.
    Unknown text is a test mistake: it raises.
    """

    provider = "hashing"
    dimensions = 384

    def __init__(self, model: str):
        self.model = model
        self.calls: list[str] = []

    def embed(self, texts):
        self.calls += list(texts)
        missing = [t for t in texts if t not in VECTORS]
        if missing:
            raise KeyError(
                f"no fixture embedding for {missing}; add it to make_memory_embeddings.py"
            )
        return np.asarray([VECTORS[t] for t in texts], dtype=np.float32)


@pytest.fixture
def fixture_embedder(settings):
    settings.MEMORY_SCORE_THRESHOLD = 0.3
    settings.MEMORY_DEDUP_THRESHOLD = 0.9
    embedder = FixtureEmbedder(settings.EMBEDDING_MODEL)
    key = (
        settings.EMBEDDING_PROVIDER,
        settings.EMBEDDING_MODEL,
        settings.EMBEDDING_DIMENSIONS,
        settings.EMBEDDING_BASE_URL,
    )
    previous = embeddings._cache.get(key)
    embeddings._cache[key] = embedder
    yield embedder
    if previous is None:
        embeddings._cache.pop(key, None)
    else:
        embeddings._cache[key] = previous


def scripted_llm(extractions: dict[str, list[str]], answer: str = "ok"):
    """A chat_fn for the fake server: the engine's extraction prompt answers the facts
    listed for the user message it holds (confidence 0.9, category context); anything
    else is the chat answer (streamed when asked)."""
    from tests.fakes.openai_server import Scripted, chat_body, chat_chunks

    def respond(payload):
        content = " ".join(str(m.get("content")) for m in payload.get("messages", []))
        if "You maintain the long-term memory" in content:  # the engine's debounced updates
            facts = [
                {"content": f, "category": "context", "confidence": 0.9}
                for message, listed in extractions.items()
                if f"user: {message}" in content
                for f in listed
            ]
            return Scripted(body=chat_body(json.dumps({"newFacts": facts, "factsToRemove": []})))
        if payload.get("stream"):
            return Scripted(
                stream_chunks=chat_chunks([answer[: len(answer) // 2], answer[len(answer) // 2 :]])
            )
        return Scripted(body=chat_body(answer))

    return respond
