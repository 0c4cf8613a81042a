"""System checks run at start-up (``manage.py check`` and every server start)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register


@register(Tags.compatibility)
def provider_configuration(app_configs: Any, **kwargs: Any) -> list:
    problems: list[CheckMessage] = []
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
