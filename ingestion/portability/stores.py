"""The memory stores family: each store's definition (type and configuration, ``${VAR}``
references as written), its items, and its attachments to agent nodes of flows. A file
store's items are its files' index: the store is loaded (its files indexed again) once
the import has committed.

Lines: ``memory_store`` (``id``, ``name``, ``store_type``, ``config``, ``embedding_model``),
``store_item`` (its ``store``, ``content_summary``, ``summary_hash``,
``input_snapshot``, ``output_snapshot``, ``metadata``, ``session_id``, ``created_at``
and, with vectors, ``embedding``) and ``attachment`` (its ``flow``, ``node_id``,
``store``, ``position``, ``retrieve_stage``, ``top_k``, ``similarity_threshold``,
``read``, ``write``). A store the target refuses (an invalid configuration, a
``${VAR}`` it does not set) is a bad line: nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model

from core.errors import ServiceError
from core.validation import validate_node_id
from ingestion.portability.common import (
    Ids,
    RawJSON,
    bad,
    checked_metadata,
    embedding,
    iso,
    number,
    old_id,
    text,
    vector_text,
    when,
)
from memories.stores.models import STAGES, MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.services import backend_for, memory_store_load, memory_store_validate_new

ATTACHMENT = ("position", "retrieve_stage", "top_k", "similarity_threshold", "read", "write")
SNAPSHOTS = ("input_snapshot", "output_snapshot", "metadata")


def export(owner_id: int, vectors: bool) -> Iterator[dict[str, Any]]:
    stores = MemoryStore.objects.filter(owner_id=owner_id).order_by("name")
    for store in stores:
        yield {"type": "memory_store", "id": str(store.pk), "name": store.name,
               "store_type": store.type, "config": store.config,
               "embedding_model": store.embedding_model}  # fmt: skip
    items = MemoryItem.objects.filter(store__in=stores).order_by("store__name", "created_at", "id")
    items = items.defer("embedding")
    for item in (items.annotate(vector=vector_text()) if vectors else items).iterator(
        chunk_size=2000
    ):
        line = {
            "type": "store_item", "store": str(item.store_id),
            "content_summary": item.content_summary, "summary_hash": item.summary_hash,
            **{name: getattr(item, name) for name in SNAPSHOTS}, "session_id": item.session_id,
            "created_at": iso(item.created_at),
        }  # fmt: skip
        if vectors:
            vec = item.vector  # type: ignore[attr-defined]  # (annotated)
            line["embedding"] = None if vec is None else RawJSON(vec)
        yield line
    attachments = MemoryAttachment.objects.filter(store__in=stores).order_by(
        "flow__name", "node_id", "position", "store__name"
    )
    for a in attachments:
        yield {"type": "attachment", "flow": str(a.flow_id), "node_id": a.node_id,
               "store": str(a.store_id), **{name: getattr(a, name) for name in ATTACHMENT}}  # fmt: skip


@dataclass
class Stores:
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)
    items: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[dict[str, Any]] = field(default_factory=list)
    types = ("memory_store", "store_item", "attachment")

    def parse(self, obj: dict[str, Any], line: int, flows: dict[str, Any]) -> None:
        kind = obj["type"]
        if kind == "memory_store":
            config = obj.get("config") or {}
            if not isinstance(config, dict):
                raise bad(line, "config is not an object")
            self.stores[old_id(obj.get("id"), line)] = {
                "line": line, "name": text(obj, "name", line, blank=False, limit=100),
                "type": text(obj, "store_type", line, blank=False, limit=64), "config": config,
                "embedding_model": obj.get("embedding_model") or "", "valid": None,
            }  # fmt: skip
            return
        store = old_id(obj.get("store"), line, "store")
        if store not in self.stores:
            raise bad(line, f"store {store} is not a memory_store line before it")
        if kind == "store_item":
            snapshots = {name: obj.get(name) or {} for name in SNAPSHOTS}
            if not all(isinstance(v, dict) for v in snapshots.values()):
                raise bad(line, "input_snapshot, output_snapshot and metadata are objects")
            checked_metadata(snapshots["metadata"], line)
            digest = obj.get("summary_hash")
            self.items.append({
                "line": line, "store": store,
                "content_summary": text(obj, "content_summary", line, blank=False),
                "summary_hash": digest if isinstance(digest, str) and digest else None,
                **snapshots, "session_id": text(obj, "session_id", line, limit=255),
                "created_at": when(obj.get("created_at"), line, "created_at", True),
                "embedding": embedding(obj, line),
                "embedding_model": self.stores[store]["embedding_model"],
            })  # fmt: skip
            return
        flow = old_id(obj.get("flow"), line, "flow")
        if flow not in flows:
            raise bad(line, f"flow {flow} is not a flow line before it")
        stages = obj.get("retrieve_stage") or []
        if not isinstance(stages, list) or not set(stages) <= set(STAGES):
            raise bad(line, f"retrieve_stage takes {', '.join(STAGES)}")
        top_k = int(number(obj, "top_k", line, 3))
        threshold = float(number(obj, "similarity_threshold", line, -1.0))
        if not 1 <= top_k <= 100 or not -1 <= threshold <= 1:
            raise bad(line, "top_k is 1-100 and similarity_threshold -1 to 1")
        try:
            node = validate_node_id(obj.get("node_id"))
        except ServiceError as exc:
            raise bad(line, str(exc)) from None
        self.attachments.append({
            "line": line, "flow": flow, "store": store, "node_id": node,
            "position": int(number(obj, "position", line, 0)), "retrieve_stage": stages,
            "top_k": top_k, "similarity_threshold": threshold,
            "read": bool(obj.get("read", True)), "write": bool(obj.get("write", True)),
        })  # fmt: skip

    def check(self, owner_id: int, ids: Ids) -> None:
        """Each new store as the target would create it (its configuration valid, its
        variables set, its name free): else its line is bad."""
        owner = get_user_model().objects.get(pk=owner_id)
        for old, store in self.stores.items():
            if MemoryStore.objects.filter(pk=ids.new("memory_store", old)).exists():
                continue  # imported before
            try:
                store["valid"] = memory_store_validate_new(
                    owner=owner, name=store["name"], type=store["type"], config=store["config"]
                )
            except ServiceError as exc:
                raise bad(store["line"], f"store {store['name']!r}: {exc}") from None

    def embedders(self, ids: Ids) -> dict[str, Any]:
        """Each store's embedder (None: it does not embed), made before any write."""
        out = {}
        for old, store in self.stores.items():
            row = MemoryStore.objects.filter(pk=ids.new("memory_store", old)).first()
            if row is None and store["valid"] is not None:
                row = _unsaved(store, store["valid"])
            out[old] = backend_for(row).embedder() if row is not None else None
        return out

    def write(self, owner_id: int, ids: Ids) -> dict[str, int]:
        counts = {"stores": 0, "store_items": 0, "attachments": 0}
        for old, store in self.stores.items():
            pk = ids.new("memory_store", old)
            if MemoryStore.objects.filter(pk=pk).exists():
                continue
            row = _unsaved(store, store["valid"], pk=pk, owner_id=owner_id)
            row.save(force_insert=True)
            backend_for(row).created()
            counts["stores"] += 1
        for item in self.items:
            store_id = ids.new("memory_store", item["store"])
            found = MemoryItem.objects.filter(store_id=store_id)
            same = (found.filter(summary_hash=item["summary_hash"]) if item["summary_hash"] else
                    found.filter(created_at=item["created_at"],
                                 content_summary=item["content_summary"]))  # fmt: skip
            if same.exists():
                continue
            vec = item["embedding"]
            MemoryItem.objects.create(
                store_id=store_id, content_summary=item["content_summary"],
                summary_hash=item["summary_hash"], session_id=item["session_id"],
                created_at=item["created_at"], embedding=vec,
                dimensions=len(vec) if vec is not None else None,
                **{name: item[name] for name in SNAPSHOTS},
            )  # fmt: skip
            counts["store_items"] += 1
        for a in self.attachments:
            _, created = MemoryAttachment.objects.get_or_create(
                flow_id=ids.new("flow", a["flow"]), node_id=a["node_id"],
                store_id=ids.new("memory_store", a["store"]),
                defaults={name: a[name] for name in ATTACHMENT},
            )  # fmt: skip
            counts["attachments"] += created
        return counts

    def load(self, ids: Ids) -> None:
        """After the commit: the file stores index their files again."""
        for old in self.stores:
            row = MemoryStore.objects.filter(pk=ids.new("memory_store", old)).first()
            if row is not None and row.knowledge_base_id is not None:
                memory_store_load(store=row)


def _unsaved(store: dict[str, Any], valid: Any, **fields: Any) -> MemoryStore:
    spec = valid.spec
    return MemoryStore(
        name=store["name"], type=valid.type.name, config=valid.config,
        embedding_provider=spec.provider if spec else "", embedding_model=spec.model if spec else "",
        embedding_dimensions=spec.dimensions if spec else None, **fields,
    )  # fmt: skip
