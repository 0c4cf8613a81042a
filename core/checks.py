"""System checks run at start-up (``manage.py check`` and every server start)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register(Tags.compatibility)
def provider_configuration(app_configs: Any, **kwargs: Any) -> list:
    problems = []
    if settings.EMBEDDING_PROVIDER == "local" and settings.EMBEDDING_DIMENSIONS != 384:
        problems.append(
            Error(
                "EMBEDDING_PROVIDER=local produces 384-dimension vectors, "
                f"but EMBEDDING_DIMENSIONS is {settings.EMBEDDING_DIMENSIONS}.",
                hint="Unset EMBEDDING_DIMENSIONS or set it to 384.",
                id="core.E001",
            )
        )
    if settings.EMBEDDING_PROVIDER == "openai" and not (
        settings.EMBEDDING_BASE_URL or settings.EMBEDDING_API_KEY
    ):
        problems.append(
            Error(
                "EMBEDDING_PROVIDER=openai needs an endpoint.",
                hint="Set EMBEDDING_BASE_URL (and EMBEDDING_API_KEY if it needs one).",
                id="core.E002",
            )
        )
    if not settings.LLM_BASE_URL:
        problems.append(
            Warning(
                "No chat LLM is configured: fact extraction and the chat proxy answer 503.",
                hint="Set LLM_BASE_URL and LLM_MODEL to an OpenAI-compatible endpoint.",
                id="core.W001",
            )
        )
    return problems


@register(Tags.compatibility)
def knowledge_base_embedding_mismatch(app_configs: Any, **kwargs: Any) -> list:
    """Bases whose stored embedding configuration differs from the configured provider.

    Their searches and ingestion still use the model they were created with; this
    warns that a provider change left existing data behind (re-create or
    regenerate those bases to move them).
    """
    from django.db import DatabaseError

    from knowledge.models import KnowledgeBase

    try:
        stale = (
            KnowledgeBase.objects.exclude(
                embedding_provider=settings.EMBEDDING_PROVIDER,
                embedding_model=settings.EMBEDDING_MODEL,
                embedding_dimensions=settings.EMBEDDING_DIMENSIONS,
            )
            .values_list("embedding_provider", "embedding_model", "embedding_dimensions")
            .distinct()
        )
        stale = list(stale)
    except DatabaseError:  # not migrated yet, or no database: nothing to compare
        return []
    return [
        Warning(
            f"Knowledge bases exist with embeddings from {provider}/{model} ({dims} dims), "
            f"but the configured provider is {settings.EMBEDDING_PROVIDER}/"
            f"{settings.EMBEDDING_MODEL} ({settings.EMBEDDING_DIMENSIONS} dims).",
            hint="They keep using their own model. Restore the old settings, or re-create "
            "those bases (memory bases: regenerate) to move them to the new model.",
            id="core.W002",
        )
        for provider, model, dims in stale
    ]
