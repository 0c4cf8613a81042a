"""What the engine's LLM-backed work shares: the JSON calls (read by the one parser,
``core.providers.json_answer``, asked again once when unreadable), the fields of a fact
as models write them, and embeddings computed before a transaction."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from django.conf import settings

from core.metrics import counter_add
from core.providers.embeddings import Embedder
from core.providers.json_answer import Field, Reading, Shape, complete_answer
from core.providers.llm import ChatLLM, get_llm
from memories.facts.models import CATEGORIES
from memories.facts.services import validate_content

logger = logging.getLogger("memories.decisions")

# A fact's fields as models write them: the documented name first, then the others
# seen in the wild. A category outside the list is mapped (these synonyms, a plural)
# or becomes "context".
CATEGORY_SYNONYMS = {
    "like": "preference", "likes": "preference", "dislike": "preference",
    "favorite": "preference", "favourite": "preference", "taste": "preference",
    "opinion": "preference", "fact": "knowledge", "skill": "knowledge",
    "expertise": "knowledge", "info": "knowledge", "information": "knowledge",
    "personal": "context", "personalinfo": "context", "profile": "context",
    "identity": "context", "biographical": "context", "background": "context",
    "location": "context", "relationship": "context", "work": "context", "job": "context",
    "habit": "behavior", "routine": "behavior", "pattern": "behavior", "behaviour": "behavior",
    "objective": "goal", "plan": "goal", "intent": "goal", "intention": "goal",
    "aspiration": "goal", "project": "goal", "update": "correction", "fix": "correction",
    "change": "correction",
}  # fmt: skip
CONTENT = Field("content", aliases=("fact", "text", "memory", "statement", "value",
                                    "description", "sentence"))  # fmt: skip
CATEGORY = Field("category", "choice", ("type", "kind", "category_name"), CATEGORIES,
                 CATEGORY_SYNONYMS, default="context")  # fmt: skip
CONFIDENCE = Field(
    "confidence", "number", ("score", "certainty", "probability", "confidence_score")
)
# Texts that are never a fact: a bare category name (models answer {"preference": ...}).
FACT_PLACEHOLDERS = frozenset(CATEGORIES)


class JsonCalls:
    """The LLM calls of one run that expect JSON, counted (calls and tokens)."""

    def __init__(self, llm: ChatLLM, model: str | None):
        self.llm, self.model, self.count, self.tokens = llm, model, 0, 0

    def read(self, messages: list[dict[str, str]], *, shape: Shape, what: str,
             source: str = "") -> Reading:  # fmt: skip
        """The answer to ``messages`` read as ``shape`` (``complete_answer``: asked in
        the provider's response format, asked again once when unreadable). An answer
        still unreadable is counted in ``engine_llm_malformed_total``; the caller says
        what it means (``reading.malformed``). Provider errors are raised."""
        kwargs: dict[str, Any] = {"temperature": 0}
        if self.model:
            kwargs["model"] = self.model
        answer = complete_answer(
            self.llm, messages, shape=shape, what=what, source=source,
            event="memory_llm_malformed_json", log=logger, **kwargs,
        )  # fmt: skip
        self.count += len(answer.results)
        self.tokens += sum(int(r.usage.get("total_tokens") or 0) for r in answer.results)
        if answer.reading.malformed:
            counter_add("engine_llm_malformed_total")
        return answer.reading


def json_calls(llm: ChatLLM | None, *, feature: str) -> JsonCalls:
    """LLM calls answering JSON (``JsonCalls``). Raises ``ProviderNotConfigured`` (503,
    names ``LLM_BASE_URL``) without an LLM."""
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
