"""The knowledge family: knowledge bases (their settings and chunk settings) and their
chunks as they are (text, place in the document, sources, vector), those of memory
bases included. A file store's base is not exported: its chunks are its files' index,
made again when the store is loaded.

Lines: ``knowledge_base`` (``id``, ``name``, ``description``, ``language``,
``chunk_size``, ``chunk_overlap``, ``source_kind``, ``embedding_model``,
``memory_base``: true for a memory base's own) and ``chunk`` (its ``knowledge_base``,
``source_key``, ``document_key``, ``text``, ``chunk_index``, ``chunk_total``, the source
fields, ``metadata``, ``timestamp`` and, with vectors, ``embedding``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

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
from knowledge.models import FTS_LANGUAGES, Chunk, KnowledgeBase
from knowledge.services.errors import DocumentIn
from knowledge.services.ingest import ChunkIn, knowledge_base_restore_chunks
from memories.stores.models import MemoryStore

SOURCE_FIELDS = ("message_id", "session_id", "flow_id", "run_id", "sender", "source_type",
                 "file_path", "content_hash")  # fmt: skip


def export(owner_id: int, vectors: bool) -> Iterator[dict[str, Any]]:
    stores = MemoryStore.objects.filter(owner_id=owner_id, knowledge_base__isnull=False)
    kbs = (
        KnowledgeBase.objects.filter(owner_id=owner_id)
        .exclude(pk__in=stores.values("knowledge_base_id"))
        .order_by("name")
    )
    for kb in kbs:
        yield {
            "type": "knowledge_base", "id": str(kb.pk), "name": kb.name,
            "description": kb.description, "language": kb.language,
            "chunk_size": kb.chunk_size, "chunk_overlap": kb.chunk_overlap,
            "source_kind": kb.source_kind, "embedding_model": kb.embedding_model,
            "memory_base": kb.is_memory_base,
        }  # fmt: skip
    chunks = Chunk.objects.filter(knowledge_base__in=kbs).order_by(
        "knowledge_base__name", "source_key"
    )
    chunks = chunks.defer("embedding")
    for c in (chunks.annotate(vector=vector_text()) if vectors else chunks).iterator(
        chunk_size=2000
    ):
        line = {
            "type": "chunk", "knowledge_base": str(c.knowledge_base_id),
            "source_key": c.source_key, "document_key": c.document_key, "text": c.text,
            "chunk_index": c.chunk_index, "chunk_total": c.chunk_total,
            **{name: getattr(c, name) for name in SOURCE_FIELDS},
            "metadata": c.metadata, "timestamp": iso(c.source_timestamp),
        }  # fmt: skip
        if vectors:
            line["embedding"] = RawJSON(c.vector)  # type: ignore[attr-defined]  # (annotated)
        yield line


@dataclass
class Knowledge:
    bases: dict[str, dict[str, Any]] = field(default_factory=dict)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    types = ("knowledge_base", "chunk")

    def parse(self, obj: dict[str, Any], line: int) -> None:
        if obj["type"] == "knowledge_base":
            language = obj.get("language") or "english"
            if language not in FTS_LANGUAGES:
                raise bad(line, f"language {language!r} is not one of {', '.join(FTS_LANGUAGES)}")
            size, overlap = number(obj, "chunk_size", line), number(obj, "chunk_overlap", line)
            if not 1 <= size or not 0 <= overlap < size:
                raise bad(line, "chunk_overlap must be below chunk_size")
            self.bases[old_id(obj.get("id"), line)] = {
                "line": line, "name": text(obj, "name", line, blank=False, limit=200),
                "description": text(obj, "description", line), "language": language,
                "chunk_size": int(size), "chunk_overlap": int(overlap),
                "source_kind": obj.get("source_kind") or KnowledgeBase.SourceKind.DOCUMENTS,
                "memory_base": bool(obj.get("memory_base")),
                "embedding_model": obj.get("embedding_model") or "",
            }  # fmt: skip
            return
        kb = old_id(obj.get("knowledge_base"), line, "knowledge_base")
        if kb not in self.bases:
            raise bad(line, f"knowledge base {kb} is not a knowledge_base line before it")
        self.chunks.append({
            "line": line, "knowledge_base": kb,
            "source_key": text(obj, "source_key", line, blank=False, limit=600),
            "document_key": text(obj, "document_key", line, blank=False, limit=512),
            "content": text(obj, "text", line, blank=False),
            "chunk_index": int(number(obj, "chunk_index", line, 0)),
            "chunk_total": int(number(obj, "chunk_total", line, 1)),
            "sources": {name: text(obj, name, line) for name in SOURCE_FIELDS},
            "metadata": checked_metadata(
                obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}, line
            ),
            "timestamp": when(obj.get("timestamp"), line, "timestamp"),
            "embedding": embedding(obj, line),
            "embedding_model": self.bases[kb]["embedding_model"],
        })  # fmt: skip

    def check(self, owner_id: int, ids: Ids) -> None:
        for old, kb in self.bases.items():
            if kb["memory_base"]:
                continue  # (made by its memory base, named by it)
            other = KnowledgeBase.objects.filter(owner_id=owner_id, name=kb["name"]).first()
            if other is not None and other.pk != ids.new("knowledge_base", old):
                raise bad(kb["line"], f"a knowledge base named {kb['name']!r} already exists")

    def write_bases(self, owner_id: int, ids: Ids, config: Any) -> int:
        """The bases that are not memory bases' (those come with their memory base)."""
        made = 0
        for old, kb in self.bases.items():
            if not kb["memory_base"]:
                made += self.write_base(owner_id, ids, config, old)
        return made

    def write_base(self, owner_id: int, ids: Ids, config: Any, old: str) -> int:
        """One base, with its own settings and the target's embedding; 1 when new."""
        kb = self.bases[old]
        row, created = KnowledgeBase.objects.get_or_create(
            pk=ids.new("knowledge_base", old),
            defaults={
                "owner_id": owner_id, "name": kb["name"], "description": kb["description"],
                "language": kb["language"], "chunk_size": kb["chunk_size"],
                "chunk_overlap": kb["chunk_overlap"], "source_kind": kb["source_kind"],
                "is_memory_base": kb["memory_base"], "embedding_provider": config.provider,
                "embedding_model": config.model, "embedding_dimensions": config.dimensions,
            },
        )  # fmt: skip
        ids.known[("knowledge_base", old)] = row
        return int(created)

    def write_chunks(self, ids: Ids) -> int:
        by_base: dict[str, list[ChunkIn]] = {}
        for c in self.chunks:
            flow = c["sources"]["flow_id"]
            new_flow = ids.new("flow", flow) if flow and ("flow", flow) in ids.known else None
            sources = {**c["sources"], "flow_id": str(new_flow) if new_flow else flow}
            document = DocumentIn(text=c["content"], source_key=c["document_key"],
                                  metadata=c["metadata"], timestamp=c["timestamp"], **sources)  # fmt: skip
            by_base.setdefault(c["knowledge_base"], []).append(ChunkIn(
                c["source_key"], c["document_key"], c["content"], c["embedding"],
                c["chunk_index"], c["chunk_total"], document,
            ))  # fmt: skip
        return sum(
            knowledge_base_restore_chunks(
                knowledge_base=ids.known[("knowledge_base", old)], chunks=rows
            )  # fmt: skip
            for old, rows in by_base.items()
        )
