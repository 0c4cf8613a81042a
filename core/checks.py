"""System checks run at start-up (``manage.py check`` and every server start)."""

from __future__ import annotations

import os
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


# Variables earlier releases read and this one does not (docs/operations.md, upgrade
# notes): a value set is ignored, so a deployment that still sets one is told so.
NO_LONGER_READ = frozenset(
    """
    API_MAX_JSON_DEPTH API_PAGE_SIZE CHAT_MAX_MESSAGES CHAT_MEMORY_TOOLS CHAT_MODELS
    CHAT_PROXY_FLOW CHAT_TOOL_MAX_ROUNDS DATABASE_RETRY_AFTER
    EMBEDDED_DB_MAINTENANCE_WORK_MEM EMBEDDING_BATCH_SIZE ENGINE_CORRECTION_SHARE
    ENGINE_DREAM_LOOKBACK_DAYS ENGINE_DREAM_MAX_DROP ENGINE_DREAM_SCHEDULE
    ENGINE_EXACT_CAP_FACTS ENGINE_EXACT_MAX_FACTS ENGINE_FLIP_FLOP_WINDOW
    ENGINE_HALF_LIFE_DAYS ENGINE_MIN_CONFIDENCE ENGINE_SUMMARY_MAX_TOKENS
    ENGINE_VECTOR_WEIGHT ENGINE_WALK_MIN_SHARE HISTORY_MAX_TOKENS HISTORY_MESSAGE_LIMIT
    INGEST_SYNC_MAX_CHARS KNOWLEDGE_DEFERRED_INDEXING KNOWLEDGE_INDEX_BATCH
    KNOWLEDGE_INDEX_RUN_SECONDS MEMORY_CONFLICT_CANDIDATES
    MEMORY_CONFLICT_MIN_SIMILARITY MEMORY_DEDUP_THRESHOLD MEMORY_GLOBAL_MIN_PERSONAL
    MEMORY_HYBRID MEMORY_PROMPT_MAX_TOKENS MEMORY_RELATIVE_THRESHOLD
    MEMORY_SCORE_THRESHOLD MEMORY_SKIP_SELF_CHECK MEMORY_STORE_EF_SEARCH
    MEMORY_STORE_EXACT_MAX_ITEMS MEMORY_STORE_INLINE_MAX_BYTES
    MEMORY_STORE_PROMPT_MAX_TOKENS MEMORY_TOP_K MEMORY_UPDATE_KEEP_DAYS
    MEMORY_UPDATE_MAX_ATTEMPTS MEMORY_UPDATE_MAX_WAIT_SECONDS NODE_MEMORY_GZIP_BYTES
    NODE_MEMORY_IDLE_DAYS Q_MAX_ATTEMPTS Q_POLL Q_SYNC SEARCH_BM25_B SEARCH_BM25_K1
    SEARCH_BM25_PRUNE SEARCH_CANDIDATES SEARCH_CONTEXT_WEIGHT SEARCH_CONTEXT_WINDOW
    SEARCH_EF_SEARCH SEARCH_EF_SEARCH_SCALE SEARCH_EXACT_MAX_ROWS SEARCH_FUSION
    SEARCH_ITERATIVE_SCAN SEARCH_MAX_SCAN_TUPLES SEARCH_ONE_STATEMENT
    SEARCH_PARALLEL_LEGS SEARCH_PARALLEL_WORKERS SEARCH_REWRITE SEARCH_REWRITE_MODEL
    SEARCH_REWRITE_QUERIES SEARCH_REWRITE_TIMEOUT SEARCH_REWRITE_WEIGHT SEARCH_RRF_K
    SEARCH_SPLIT_MIN_ROWS SEARCH_VECTOR_WEIGHT TOKEN_ENCODING
    """.split()
)


@register(Tags.compatibility)
def variables_no_longer_read(app_configs: Any, **kwargs: Any) -> list:
    """A variable of an earlier release still set (in the environment or the env file)."""
    stale = sorted(name for name in NO_LONGER_READ if name in os.environ)
    if not stale:
        return []
    return [
        Warning(
            f"Set but no longer read (ignored): {', '.join(stale)}.",
            hint="Remove them; docs/operations.md (Upgrade notes) says what took each one's place.",
            id="core.W003",
        )
    ]
