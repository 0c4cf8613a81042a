"""Reads for memory stores, items and attachments, always scoped by owner."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, QuerySet

from core.key_limits import not_owned, resource_check, resource_filter
from knowledge.models import Chunk
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore


def memory_store_list(*, owner: User) -> QuerySet[MemoryStore]:
    """The owner's stores by name (those a narrowed key may reach), with ``own_items``
    (their MemoryItem rows) and the knowledge base of file stores (for its chunk count)
    in the same query."""
    return resource_filter(_stores(owner), "memory_stores")


def _stores(owner: User) -> QuerySet[MemoryStore]:
    return (
        MemoryStore.objects.filter(owner=owner)
        .select_related("knowledge_base")
        .annotate(own_items=Count("items"))
        .order_by("name", "id")
    )


def memory_store_get(*, owner: User, store_id: uuid.UUID | str) -> MemoryStore:
    """Raises MemoryStore.DoesNotExist (a 404) for a missing store or another owner's;
    a store a narrowed key may not reach is a 403 (core.key_limits)."""
    store = _stores(owner).get(pk=store_id)
    resource_check("memory_stores", store.pk)
    return store


def memory_stores_not_owned(owner_id: int, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Of ``ids``, those that are not the owner's stores (core.key_limits)."""
    return not_owned(MemoryStore.objects.filter(owner_id=owner_id), ids)


def memory_stores_by_name(*, owner: User) -> dict[str, MemoryStore]:
    return {s.name: s for s in MemoryStore.objects.filter(owner=owner)}


def memory_item_list(*, store: MemoryStore, session_id: str | None = None) -> QuerySet[Any]:
    """Newest first; the embedding is never loaded. A file store's items are the chunks
    of its files (its knowledge base's), by file then place in the file."""
    if store.knowledge_base_id is not None:
        if session_id:  # a file has no session
            return Chunk.objects.none()
        return (
            Chunk.objects.filter(knowledge_base_id=store.knowledge_base_id)
            .defer("embedding")
            .order_by("file_path", "chunk_index", "id")
        )
    qs = MemoryItem.objects.filter(store=store).defer("embedding")
    if session_id:
        qs = qs.filter(session_id=session_id)
    return qs.order_by("-id")


def memory_item_get(*, store: MemoryStore, item_id: int) -> Any:
    """One item (a file store's: one chunk of its files)."""
    if store.knowledge_base_id is not None:
        return Chunk.objects.defer("embedding").get(
            knowledge_base_id=store.knowledge_base_id, pk=item_id
        )
    return MemoryItem.objects.defer("embedding").get(store=store, pk=item_id)


def node_attachments(*, flow_id: Any, node_id: str) -> list[MemoryAttachment]:
    """A node's attachments in their configured order, each with its store (to a key
    narrowed to named stores, those of its stores: core.key_limits)."""
    attached = MemoryAttachment.objects.filter(flow_id=flow_id, node_id=node_id)
    return list(
        resource_filter(attached, "memory_stores", "store_id")
        .select_related("store", "store__knowledge_base")
        .order_by("position", "id")
    )


def owner_attachments(*, owner: User) -> QuerySet[MemoryAttachment]:
    """Every attachment of the owner's flows, grouped by flow and node, in order."""
    return (
        MemoryAttachment.objects.filter(flow__owner=owner)
        .select_related("flow", "store")
        .order_by("flow__name", "flow_id", "node_id", "position", "id")
    )
