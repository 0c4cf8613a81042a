"""Embedding providers: ``local`` (all-MiniLM-L6-v2, offline), ``openai`` (any
OpenAI-compatible endpoint) and ``hashing`` (deterministic feature hashing).

Every provider returns float32 arrays of shape ``(n, dimensions)``, L2-normalised,
and raises ``ProviderError`` on failure. Calls are made outside database
transactions by the callers.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np
from django.conf import settings

from core.providers.errors import ProviderBadResponse, ProviderError, ProviderNotConfigured
from core.providers.retry import call_with_retries
from core.providers.tokens import count_tokens
from core.tracing import embedding_span
from core.usage import usage_kind, usage_record


class Embedder(Protocol):
    provider: str
    model: str
    dimensions: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _normalise(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32, copy=False)


# --- hashing ------------------------------------------------------------------------
_WORD = re.compile(r"\w+", re.UNICODE)


@lru_cache(maxsize=200_000)
def _feature_slot(feature: str, dimensions: int) -> tuple[int, float]:
    # blake2b, not hash(): Python's str hash is salted per process, and vectors
    # must be identical across processes and machines.
    digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value % dimensions, (1.0 if (value >> 63) & 1 else -1.0)


class HashingEmbedder:
    """Words, word bigrams and character trigrams hashed into ``dimensions`` buckets.

    Deterministic, dependency-free and fast: the embedder for tests and the
    no-model fallback. Similar wording gives similar vectors; it knows no synonyms.
    """

    provider = "hashing"

    def __init__(self, *, dimensions: int = 384, model: str = "hashing-v1"):
        self.dimensions = dimensions
        self.model = model

    def _features(self, text: str) -> list[tuple[str, float]]:
        words = [w.lower() for w in _WORD.findall(text)]
        if not words:
            return [("\x00empty", 1.0)]
        features: list[tuple[str, float]] = [("w:" + w, 1.0) for w in words]
        features += [(f"b:{a} {b}", 0.7) for a, b in zip(words, words[1:])]
        for word in words:
            padded = f"<{word}>"
            features += [("c:" + padded[i : i + 3], 0.4) for i in range(len(padded) - 2)]
        return features

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        matrix = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        with embedding_span(self.model, len(texts)):
            for row, text in enumerate(texts):
                for feature, weight in self._features(text):
                    slot, sign = _feature_slot(feature, self.dimensions)
                    matrix[row, slot] += sign * weight
        return _normalise(matrix)


# --- OpenAI-compatible --------------------------------------------------------------
class OpenAIEmbedder:
    provider = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        dimensions: int,
        timeout: float,
        max_retries: int,
        backoff: float,
        batch_size: int,
        send_dimensions: bool,
    ):
        self.model = model
        self.dimensions = dimensions
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.backoff = backoff
        self.send_dimensions = send_dimensions
        # The SDK's own retries also cover 408/409 and refused connections; ours
        # retry only timeouts, 429 and 5xx, so the SDK's are switched off.
        import openai  # here, not at import: half a second every process would pay

        self.client = openai.OpenAI(
            base_url=base_url or None,
            api_key=api_key or "not-needed",
            timeout=timeout,
            max_retries=0,
        )

    def _embed_batch(self, batch: Sequence[str]) -> np.ndarray:
        kwargs: dict[str, object] = {"model": self.model, "input": list(batch)}
        if self.send_dimensions:
            kwargs["dimensions"] = self.dimensions
        response = call_with_retries(
            lambda: self.client.embeddings.create(**kwargs),  # type: ignore[arg-type]
            max_retries=self.max_retries,
            backoff=self.backoff,
        )
        usage = getattr(response, "usage", None)
        tokens = getattr(usage, "prompt_tokens", None)
        with usage_kind("embedding"):
            usage_record(
                model=self.model,
                tokens_in=tokens if tokens is not None else sum(count_tokens(t) for t in batch),
                tokens_out=0,
                estimated=tokens is None,
            )
        data = sorted(response.data or [], key=lambda item: item.index)
        if len(data) != len(batch):
            raise ProviderBadResponse(
                f"embedding provider returned {len(data)} vectors for {len(batch)} inputs"
            )
        matrix = np.asarray([item.embedding for item in data], dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != self.dimensions:
            raise ProviderBadResponse(
                f"embedding provider returned vectors of {matrix.shape[-1]} dimensions, "
                f"expected {self.dimensions} (EMBEDDING_DIMENSIONS)"
            )
        return matrix

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        with embedding_span(self.model, len(texts)):
            parts = [
                self._embed_batch(texts[i : i + self.batch_size])
                for i in range(0, len(texts), self.batch_size)
            ]
        return _normalise(np.vstack(parts))


# --- local all-MiniLM-L6-v2 ---------------------------------------------------------
class LocalEmbedder:
    provider = "local"
    model = "sentence-transformers/all-MiniLM-L6-v2"
    dimensions = 384

    def __init__(self, *, cache_dir: Path, backend: str, batch_size: int):
        from core.providers.local_minilm import MiniLMEncoder

        self.batch_size = batch_size
        self._encoder = MiniLMEncoder(cache_dir=cache_dir, backend=backend)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        try:
            with embedding_span(self.model, len(texts)):
                return self._encoder.encode(list(texts), batch_size=self.batch_size)
        except Exception as exc:  # noqa: BLE001 - surface any runtime failure uniformly
            raise ProviderError(f"local embedding model failed: {exc}") from exc


# --- factory ------------------------------------------------------------------------
@dataclass(frozen=True)
class EmbeddingConfig:
    provider: str
    model: str
    dimensions: int

    @classmethod
    def from_settings(cls) -> EmbeddingConfig:
        return cls(
            provider=settings.EMBEDDING_PROVIDER,
            model=settings.EMBEDDING_MODEL,
            dimensions=settings.EMBEDDING_DIMENSIONS,
        )


_lock = threading.Lock()
_cache: dict[tuple[object, ...], Embedder] = {}


def build_embedder(config: EmbeddingConfig | None = None) -> Embedder:
    config = config or EmbeddingConfig.from_settings()
    if config.provider == "hashing":
        return HashingEmbedder(dimensions=config.dimensions, model=config.model)
    if config.provider == "local":
        if config.dimensions != LocalEmbedder.dimensions:
            raise ProviderError(
                f"the local model has {LocalEmbedder.dimensions} dimensions; "
                f"EMBEDDING_DIMENSIONS is {config.dimensions}"
            )
        return LocalEmbedder(
            cache_dir=settings.MODEL_CACHE_DIR,
            backend=settings.LOCAL_EMBEDDING_BACKEND,
            batch_size=settings.EMBEDDING_BATCH_SIZE,
        )
    if config.provider == "openai":
        if not settings.EMBEDDING_BASE_URL and not settings.EMBEDDING_API_KEY:
            raise ProviderNotConfigured("EMBEDDING_BASE_URL", "OpenAI-compatible embeddings")
        return OpenAIEmbedder(
            base_url=settings.EMBEDDING_BASE_URL,
            api_key=settings.EMBEDDING_API_KEY,
            model=config.model,
            dimensions=config.dimensions,
            timeout=settings.EMBEDDING_TIMEOUT,
            max_retries=settings.EMBEDDING_MAX_RETRIES,
            backoff=settings.RETRY_BACKOFF_SECONDS,
            batch_size=settings.EMBEDDING_BATCH_SIZE,
            send_dimensions=bool(os.environ.get("EMBEDDING_DIMENSIONS")),
        )
    raise ProviderError(f"unknown embedding provider {config.provider!r}")


def embedder_for(config: EmbeddingConfig) -> Embedder:
    """The embedder for a stored configuration, built once per process and endpoint."""
    key = (config.provider, config.model, config.dimensions, settings.EMBEDDING_BASE_URL)
    with _lock:
        if key not in _cache:
            _cache[key] = build_embedder(config)
        return _cache[key]


def get_embedder() -> Embedder:
    """The configured embedder (the local model loads once per process)."""
    return embedder_for(EmbeddingConfig.from_settings())


def embed_texts(texts: Sequence[str]) -> np.ndarray:
    return get_embedder().embed(texts)
