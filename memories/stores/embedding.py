"""A store's ``embedding`` block: which model embeds its items, and how to reach it.

``api_key`` (and ``base_url``, if it wants) is an environment-variable reference
``${VAR}``: stored as written, resolved when an embedder is built, never stored
resolved. A store without the block embeds with the service default recorded when
it was created, and keeps it (as a knowledge base does).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from rest_framework import serializers

from core.api.fields import StrictCharField
from core.errors import Unavailable
from core.providers.embeddings import (
    Embedder,
    EmbeddingConfig,
    HashingEmbedder,
    LocalEmbedder,
    OpenAIEmbedder,
    embedder_for,
)
from memories.stores.registry import StrictConfig

PROVIDERS = ("openai", "local", "hashing", "none")
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_MODELS = {
    "openai": "text-embedding-3-small",
    "local": LocalEmbedder.model,
    "hashing": "hashing-v1",
    "none": "",
}
# Dimensions of OpenAI models, so a store knows its dimension before its first call.
OPENAI_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}


class MissingVariable(Unavailable):
    code = "missing_environment_variable"


def resolve_env(value: str) -> str:
    """``value`` with every ``${VAR}`` replaced from the environment (503 if unset)."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise MissingVariable(
                f"environment variable {name} is not set (referenced by a memory store)",
                details={"variable": name},
            )
        return os.environ[name]

    return ENV_REF.sub(substitute, value)


class EmbeddingParams(serializers.DictField):
    """Free-form like the seed's ``params``; ``dimensions`` (int) is the one we read."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        dims = value.get("dimensions")
        if dims is not None and (
            isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= 16000
        ):
            raise serializers.ValidationError({"dimensions": ["must be an integer 1-16000"]})
        return value


class EmbeddingBlock(StrictConfig):
    provider = serializers.ChoiceField(
        PROVIDERS,
        help_text="openai (any compatible endpoint), local (bundled MiniLM), "
        "hashing (deterministic, offline) or none (no embedder: recency retrieval)",
    )
    model = StrictCharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="Default per provider: text-embedding-3-small, all-MiniLM-L6-v2, hashing-v1",
    )
    api_key = StrictCharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="An environment reference such as ${API_KEY}; never a literal key",
    )
    base_url = StrictCharField(max_length=500, required=False, allow_blank=True, default="")
    params = EmbeddingParams(required=False, default=dict, help_text="dimensions: int")

    def validate_api_key(self, value: str) -> str:
        if value and not ENV_REF.fullmatch(value.strip()):
            raise serializers.ValidationError(
                "must be an environment reference like ${API_KEY} (keys are not stored)"
            )
        return value.strip()

    def validate_base_url(self, value: str) -> str:
        if value and not ENV_REF.search(value) and not re.match(r"^https?://", value):
            raise serializers.ValidationError("must be an http(s) URL or a ${VAR} reference")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        provider = attrs["provider"]
        attrs["model"] = attrs.get("model") or DEFAULT_MODELS[provider]
        params = attrs.get("params") or {}
        if provider == "openai" and attrs["model"] not in OPENAI_DIMENSIONS:
            if "dimensions" not in params:
                raise serializers.ValidationError(
                    {"params": [f"dimensions is needed for model {attrs['model']!r}"]}
                )
        if provider == "local" and params.get("dimensions", 384) != 384:
            raise serializers.ValidationError({"params": ["the local model has 384 dimensions"]})
        return attrs


@dataclass(frozen=True)
class EmbeddingSpec:
    """What a store records: provider, model, dimension (provider "none": no embedder)."""

    provider: str
    model: str
    dimensions: int | None

    @property
    def embeds(self) -> bool:
        return self.provider != "none"


def spec_from_block(block: dict[str, Any] | None) -> EmbeddingSpec:
    if not block:
        default = EmbeddingConfig.from_settings()
        return EmbeddingSpec(default.provider, default.model, default.dimensions)
    provider, model = block["provider"], block["model"]
    params = block.get("params") or {}
    if provider == "none":
        return EmbeddingSpec("none", "", None)
    if provider == "local":
        return EmbeddingSpec(provider, model, LocalEmbedder.dimensions)
    if provider == "hashing":
        return EmbeddingSpec(provider, model, int(params.get("dimensions", 384)))
    return EmbeddingSpec(provider, model, int(params.get("dimensions") or OPENAI_DIMENSIONS[model]))


_lock = threading.Lock()
_cache: dict[tuple[Any, ...], Embedder] = {}


def build_store_embedder(block: dict[str, Any] | None, spec: EmbeddingSpec) -> Embedder | None:
    """The embedder of a store: its block's, or (no block) its recorded default.

    References are resolved now, from this process's environment; the embedder is
    cached per resolved endpoint in memory only.
    """
    if not spec.embeds or spec.dimensions is None:
        return None
    if not block or spec.provider == "local":
        return embedder_for(EmbeddingConfig(spec.provider, spec.model, spec.dimensions))
    if spec.provider == "hashing":
        return HashingEmbedder(dimensions=spec.dimensions, model=spec.model)
    base_url = resolve_env(block.get("base_url") or "")
    api_key = resolve_env(block.get("api_key") or "")
    if not base_url:  # the service's endpoint, and its key unless the block names one
        base_url = settings.EMBEDDING_BASE_URL
        api_key = api_key or settings.EMBEDDING_API_KEY
    params = block.get("params") or {}
    key = (spec, base_url, api_key, "dimensions" in params)
    with _lock:
        if key not in _cache:
            _cache[key] = OpenAIEmbedder(
                base_url=base_url,
                api_key=api_key,
                model=spec.model,
                dimensions=spec.dimensions,
                timeout=settings.EMBEDDING_TIMEOUT,
                max_retries=settings.EMBEDDING_MAX_RETRIES,
                backoff=settings.RETRY_BACKOFF_SECONDS,
                batch_size=settings.EMBEDDING_BATCH_SIZE,
                send_dimensions="dimensions" in params,
            )
        return _cache[key]
