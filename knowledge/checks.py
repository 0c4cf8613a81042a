"""System checks of the knowledge store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.db.models import QuerySet

from core import tenancy

# Knowledge bases that a room above checks itself: a file memory store's own index is
# covered by the stores' check, which knows whether the store asked for that model.
# Each entry gives a queryset of knowledge base ids (imports run one way: the rooms
# register here, knowledge never imports them).
_checked_elsewhere: list[Callable[[], QuerySet[Any]]] = []


def leave_to_another_check(ids: Callable[[], QuerySet[Any]]) -> None:
    """Leave the knowledge bases whose ids ``ids()`` gives out of the mismatch check."""
    _checked_elsewhere.append(ids)


@register(Tags.compatibility)
def knowledge_base_embedding_mismatch(app_configs: Any, **kwargs: Any) -> list:
    """Bases whose stored embedding configuration differs from the configured provider.

    Their searches and ingestion still use the model they were created with; this
    warns that a provider change left existing data behind (re-create those bases to
    move them: regenerating keeps a base's model).
    """
    from django.db import DatabaseError

    from knowledge.models import KnowledgeBase

    try:
        # Every owner's rows (a check runs as nobody under `serve`, where row-level
        # security refused the query and the warning was never shown).
        with tenancy.bypass("system check: knowledge bases' embedding"):
            bases = KnowledgeBase.objects.exclude(
                embedding_provider=settings.EMBEDDING_PROVIDER,
                embedding_model=settings.EMBEDDING_MODEL,
                embedding_dimensions=settings.EMBEDDING_DIMENSIONS,
            )
            for ids in _checked_elsewhere:
                bases = bases.exclude(pk__in=ids())
            rows = bases.values_list(
                "embedding_provider", "embedding_model", "embedding_dimensions"
            ).distinct()
            stale = list(rows)
    except DatabaseError:  # not migrated yet, or no database: nothing to compare
        return []
    return [
        Warning(
            f"Knowledge bases exist with embeddings from {provider}/{model} ({dims} dims), "
            f"but the configured provider is {settings.EMBEDDING_PROVIDER}/"
            f"{settings.EMBEDDING_MODEL} ({settings.EMBEDDING_DIMENSIONS} dims).",
            hint="They keep using their own model (regenerating one keeps it too). Restore "
            "the old settings, or re-create those bases to move them to the new model (a "
            "memory base: create another for its flow, which ingests its sessions).",
            id="core.W002",  # its id from when core held it: silenced lists keep working
        )
        for provider, model, dims in stale
    ]
