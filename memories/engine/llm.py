"""What the engine's LLM-backed work shares: the JSON call with one repair or retry
(the one personal-memory formation uses) and embeddings computed before a transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from django.conf import settings

from core.providers.embeddings import Embedder
from core.providers.llm import ChatLLM, get_llm
from memories.personal.formation import _Calls
from memories.personal.services import validate_content

JsonCalls = _Calls


def json_calls(llm: ChatLLM | None, *, feature: str) -> JsonCalls:
    """LLM calls answering JSON: a malformed answer is repaired, or asked again once.
    Raises ``ProviderNotConfigured`` (503, names ``LLM_BASE_URL``) without an LLM."""
    return _Calls(llm or get_llm(feature=feature), settings.MEMORY_EXTRACTION_MODEL or None)


class PrecomputedEmbedder:
    """An embedder answering from vectors computed up front, so fact writes inside a
    transaction make no network call (a text it was not given is embedded then)."""

    def __init__(self, inner: Embedder, texts: Sequence[str]):
        self.inner = inner
        self.provider, self.model, self.dimensions = inner.provider, inner.model, inner.dimensions
        wanted = sorted({validate_content(t) for t in texts})
        vectors: Any = inner.embed(wanted) if wanted else []
        self.vectors = {
            t: np.asarray(v, dtype=np.float32) for t, v in zip(wanted, vectors, strict=True)
        }

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self.vectors]
        if missing:
            for text, vector in zip(missing, self.inner.embed(missing), strict=True):
                self.vectors[text] = np.asarray(vector, dtype=np.float32)
        return np.asarray([self.vectors[t] for t in texts], dtype=np.float32)
