"""What the engine's LLM-backed work shares: the JSON call with one repair or retry
and embeddings computed before a transaction."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from django.conf import settings

from core.metrics import counter_add
from core.providers import json_answer
from core.providers.embeddings import Embedder
from core.providers.llm import ChatLLM, get_llm
from memories.facts.services import validate_content

logger = logging.getLogger("memories.decisions")


class JsonCalls:
    """The LLM calls of one run answering JSON, and the calls and tokens they cost (what
    the run reports and ``engine_llm_calls_total`` / ``engine_llm_tokens_total`` count)."""

    def __init__(self, llm: ChatLLM, model: str | None):
        self.llm, self.model, self.count, self.tokens = llm, model, 0, 0

    def json(self, messages: list[dict[str, str]], *, what: str) -> dict[str, Any] | None:
        """The answer's JSON object: a malformed answer is repaired, or asked again once
        (``core.providers.json_answer``); None when it stays malformed (counted in
        ``engine_llm_malformed_total``)."""
        kwargs: dict[str, Any] = {"temperature": 0}
        if self.model:
            kwargs["model"] = self.model
        answer = json_answer.complete_json(
            self.llm, messages, list_key="memories", what=what,
            event="memory_llm_malformed_json", log=logger, **kwargs,
        )  # fmt: skip
        self.count += len(answer.results)
        self.tokens += sum(int(r.usage.get("total_tokens") or 0) for r in answer.results)
        if answer.value is None:
            counter_add("engine_llm_malformed_total")
        return answer.value


def json_calls(llm: ChatLLM | None, *, feature: str) -> JsonCalls:
    """LLM calls answering JSON: a malformed answer is repaired, or asked again once.
    Raises ``ProviderNotConfigured`` (503, names ``LLM_BASE_URL``) without an LLM."""
    return JsonCalls(llm or get_llm(feature=feature), settings.MEMORY_EXTRACTION_MODEL or None)


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
