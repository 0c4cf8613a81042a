"""The Memory Bases family: each memory base's settings, its flow and its own knowledge
base (exported in the knowledge family, marked ``memory_base``), and each conversation's
ingestion cursor.

Lines: ``memory_base`` (``id``, ``name``, ``flow``, ``knowledge_base``, ``kb_name``,
``threshold``, ``auto_capture``, the ``preprocess`` settings) and ``memory_base_session``
(its ``memory_base``, ``session_id``, ``cursor_message`` (a message line's ``id``),
``cursor_created_at``, ``total_processed``, ``last_sync_at``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ingestion.portability.common import Ids, bad, iso, number, old_id, text, when
from ingestion.portability.knowledge import Knowledge
from knowledge.models import KnowledgeBase
from memories.bases.models import MemoryBase, MemoryBaseSession

SETTINGS = ("threshold", "auto_capture", "preprocess", "preprocess_model",
            "preprocess_instructions", "preprocess_kill_phrase")  # fmt: skip


def export(owner_id: int) -> Iterator[dict[str, Any]]:
    bases = MemoryBase.objects.filter(owner_id=owner_id).order_by("name")
    for mb in bases:
        yield {
            "type": "memory_base", "id": str(mb.pk), "name": mb.name, "flow": str(mb.flow_id),
            "knowledge_base": str(mb.knowledge_base_id), "kb_name": mb.kb_name,
            **{name: getattr(mb, name) for name in SETTINGS},
        }  # fmt: skip
    sessions = MemoryBaseSession.objects.filter(memory_base__in=bases).order_by(
        "memory_base__name", "session_id"
    )
    for s in sessions:
        yield {
            "type": "memory_base_session", "memory_base": str(s.memory_base_id),
            "session_id": s.session_id,
            "cursor_message": str(s.cursor_message_id) if s.cursor_message_id else None,
            "cursor_created_at": iso(s.cursor_created_at), "total_processed": s.total_processed,
            "last_sync_at": iso(s.last_sync_at),
        }  # fmt: skip


@dataclass
class Bases:
    bases: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: list[dict[str, Any]] = field(default_factory=list)
    types = ("memory_base", "memory_base_session")

    def parse(self, obj: dict[str, Any], line: int, flows: dict[str, Any],
              knowledge: dict[str, Any]) -> None:  # fmt: skip
        if obj["type"] == "memory_base":
            flow = old_id(obj.get("flow"), line, "flow")
            kb = old_id(obj.get("knowledge_base"), line, "knowledge_base")
            if flow not in flows:
                raise bad(line, f"flow {flow} is not a flow line before it")
            if kb not in knowledge or not knowledge[kb]["memory_base"]:
                raise bad(line, f"knowledge base {kb} is not a memory base's knowledge_base line")
            if int(number(obj, "threshold", line, 10)) < 1:
                raise bad(line, "threshold must be at least 1")
            self.bases[old_id(obj.get("id"), line)] = {
                "line": line, "name": text(obj, "name", line, blank=False, limit=200),
                "flow": flow, "knowledge_base": kb,
                "kb_name": text(obj, "kb_name", line, limit=200) or knowledge[kb]["name"],
                "threshold": int(obj.get("threshold") or 10),
                "auto_capture": bool(obj.get("auto_capture", True)),
                "preprocess": bool(obj.get("preprocess")),
                "preprocess_model": text(obj, "preprocess_model", line, limit=200),
                "preprocess_instructions": text(obj, "preprocess_instructions", line),
                "preprocess_kill_phrase": text(obj, "preprocess_kill_phrase", line, limit=200),
            }  # fmt: skip
            return
        base = old_id(obj.get("memory_base"), line, "memory_base")
        if base not in self.bases:
            raise bad(line, f"memory base {base} is not a memory_base line before it")
        self.sessions.append({
            "line": line, "memory_base": base,
            "session_id": text(obj, "session_id", line, blank=False, limit=255),
            "cursor_message": obj.get("cursor_message"),
            "cursor_created_at": when(obj.get("cursor_created_at"), line, "cursor_created_at"),
            "total_processed": int(number(obj, "total_processed", line, 0)),
            "last_sync_at": when(obj.get("last_sync_at"), line, "last_sync_at"),
        })  # fmt: skip

    def check(self, owner_id: int, ids: Ids, knowledge: dict[str, Any]) -> None:
        for old, mb in self.bases.items():
            mine = ids.new("memory_base", old)
            other = MemoryBase.objects.filter(owner_id=owner_id, name=mb["name"]).first()
            if other is not None and other.pk != mine:
                raise bad(mb["line"], f"a memory base named {mb['name']!r} already exists")
            kb_name = knowledge[mb["knowledge_base"]]["name"]
            kb = KnowledgeBase.objects.filter(owner_id=owner_id, name=kb_name).first()
            if kb is not None and kb.pk != ids.new("knowledge_base", mb["knowledge_base"]):
                raise bad(mb["line"], f"a knowledge base named {kb_name!r} already exists")

    def write(self, owner_id: int, ids: Ids, knowledge: Knowledge, config: Any) -> int:
        made = 0
        for old, mb in self.bases.items():
            knowledge.write_base(owner_id, ids, config, mb["knowledge_base"])
            kb = ids.known[("knowledge_base", mb["knowledge_base"])]
            _, created = MemoryBase.objects.get_or_create(
                pk=ids.new("memory_base", old),
                defaults={
                    "owner_id": owner_id, "name": mb["name"], "knowledge_base": kb,
                    "flow_id": ids.new("flow", mb["flow"]), "kb_name": mb["kb_name"],
                    **{name: mb[name] for name in SETTINGS},
                },
            )  # fmt: skip
            made += created
        for s in self.sessions:
            cursor = ids.known.get(("message", str(s["cursor_message"])))
            MemoryBaseSession.objects.get_or_create(
                memory_base_id=ids.new("memory_base", s["memory_base"]), session_id=s["session_id"],
                defaults={
                    "cursor_message_id": cursor, "cursor_created_at": s["cursor_created_at"],
                    "total_processed": s["total_processed"], "last_sync_at": s["last_sync_at"],
                },
            )  # fmt: skip
        return made
