"""Reads for memory stores, items and attachments, always scoped by owner."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.db.models import Count, Field, Model, QuerySet

from core.key_limits import not_owned, resource_check, resource_filter, resource_ids
from core.replicas import read_connection
from knowledge.models import Chunk, KnowledgeBase
from knowledge.retrieval.db import fetch
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore

M = TypeVar("M", bound=Model)


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


def memory_stores_holding() -> QuerySet[MemoryStore]:
    """The stores that keep a knowledge base of their own (a file store's, in
    ``knowledge_base_id``): a key narrowed on memory stores reaches such a base only
    with its store (core.key_limits)."""
    return MemoryStore.objects.filter(knowledge_base__isnull=False)


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


def _columns(model: type[Model], alias: str) -> tuple[list[Field[Any, Any]], str]:
    fields = list(model._meta.concrete_fields)
    return fields, ", ".join(f'{alias}."{f.column}"' for f in fields)


_ATTACHMENT, _attachment = _columns(MemoryAttachment, "a")
_STORE, _store = _columns(MemoryStore, "s")
_BASE, _base = _columns(KnowledgeBase, "k")
# Every retrieve call of a node reads its attachments: one prepared statement
# (``knowledge.retrieval.db``), where the ORM's query with its two joins was compiled and
# planned anew each time (1.44 ms against 0.24; a three-store retrieve call took 0.90 of
# its time). The columns are the models' own, so a field added to one is read too.
_NODE_ATTACHMENTS = (
    f"SELECT {_attachment}, {_store}, {_base}"
    f" FROM {MemoryAttachment._meta.db_table} a"
    f" JOIN {MemoryStore._meta.db_table} s ON s.id = a.store_id"
    f" LEFT JOIN {KnowledgeBase._meta.db_table} k ON k.id = s.knowledge_base_id"
    " WHERE a.flow_id = %s AND a.node_id = %s AND (%s::uuid[] IS NULL OR a.store_id = ANY(%s::uuid[]))"
    " ORDER BY a.position, a.id"
)


def _instance(model: type[M], fields: list[Field[Any, Any]], values: Sequence[Any], db: Any) -> M:
    """A model instance from its columns' values read on the connection ``db``, as the
    ORM makes it (each field's conversion from the database applied)."""
    converted = [
        v if v is None or not hasattr(f, "from_db_value") else f.from_db_value(v, None, db)
        for f, v in zip(fields, values)
    ]
    return model.from_db(db.alias, [f.attname for f in fields], converted)


def node_attachments(*, flow_id: Any, node_id: str) -> list[MemoryAttachment]:
    """A node's attachments in their configured order, each with its store and a file
    store's knowledge base (to a key narrowed to named stores, those of its stores:
    core.key_limits)."""
    named = resource_ids("memory_stores")
    ids = None if named is None else sorted(named)
    rows, _ = fetch(_NODE_ATTACHMENTS, [flow_id, node_id, ids, ids])
    db = read_connection()  # (where ``fetch`` read them, as the ORM's router chooses)
    a, s = len(_ATTACHMENT), len(_ATTACHMENT) + len(_STORE)
    out = []
    for row in rows:
        attachment = _instance(MemoryAttachment, _ATTACHMENT, row[:a], db)
        store = _instance(MemoryStore, _STORE, row[a:s], db)
        base = None if row[s] is None else _instance(KnowledgeBase, _BASE, row[s:], db)
        store._state.fields_cache["knowledge_base"] = base
        attachment._state.fields_cache["store"] = store
        out.append(attachment)
    return out


def owner_attachments(*, owner: User) -> QuerySet[MemoryAttachment]:
    """Every attachment of the owner's flows, grouped by flow and node, in order."""
    return (
        MemoryAttachment.objects.filter(flow__owner=owner)
        .select_related("flow", "store")
        .order_by("flow__name", "flow_id", "node_id", "position", "id")
    )
