"""System check: stores whose recorded embedding is not the configured default."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.db.models import QuerySet

from core import tenancy
from knowledge.checks import leave_to_another_check


def _store_indexes() -> QuerySet[Any]:
    """A file store's knowledge base embeds with what the store recorded: this check
    covers it (a warning when a store without a block fell behind the default, none
    when the store names its own model)."""
    from memories.stores.models import MemoryStore

    return MemoryStore.objects.exclude(knowledge_base=None).values("knowledge_base_id")


leave_to_another_check(_store_indexes)


@register(Tags.compatibility)
def memory_store_embedding_mismatch(app_configs: Any, **kwargs: Any) -> list:
    """Stores without an ``embedding`` block recorded the service default when they
    were created and keep embedding with it; warn when the default has moved on.
    (Stores with a block embed with what it names: nothing to compare.)"""
    from django.db import DatabaseError

    from memories.stores.models import MemoryStore

    try:
        # Every owner's rows (a check runs as nobody under `serve`, where row-level
        # security refused the query and the warning was never shown).
        with tenancy.bypass("system check: memory stores' embedding"):
            stale = list(
                MemoryStore.objects.exclude(embedding_provider__in=["", "none"])
                .exclude(
                    embedding_provider=settings.EMBEDDING_PROVIDER,
                    embedding_model=settings.EMBEDDING_MODEL,
                    embedding_dimensions=settings.EMBEDDING_DIMENSIONS,
                )
                .values_list(
                    "name",
                    "owner__username",
                    "config",
                    "embedding_provider",
                    "embedding_model",
                    "embedding_dimensions",
                )
            )
    except DatabaseError:  # not migrated yet, or no database
        return []
    warnings = []
    for name, owner, config, provider, model, dims in stale:
        if (config or {}).get("embedding"):
            continue
        warnings.append(
            Warning(
                f"Memory store {name!r} of {owner!r} embeds with {provider}/{model} ({dims} dims), recorded "
                f"when it was created; the configured default is now "
                f"{settings.EMBEDDING_PROVIDER}/{settings.EMBEDDING_MODEL} "
                f"({settings.EMBEDDING_DIMENSIONS} dims).",
                hint="It keeps using its own model. Give it an explicit embedding block, or "
                "delete and re-create it to move it to the new default.",
                id="memory_stores.W001",
            )
        )
    return warnings
