"""The conversations family: flows, their messages, their nodes' memory documents and the
running conversation summaries.

Lines: ``flow`` (``id``, ``name``), ``message`` (its ``flow``, ``session_id``, caller
``message_id``, ``run_id``, ``is_output``, ``role``, ``sender``, ``sender_name``,
``text``, ``content``, ``files``, ``parent`` (another message line's ``id``),
``starts_thread``, ``created_at``), ``node_memory`` (a node's memory document of a
conversation of the flow, as stored) and ``summary`` (``key``, ``text``,
``summarized_ids``, ``last_summarized_id``, ``token_count``, ``version``; a key naming a
flow, ``flow:<id>:<session>``, is renamed with the flow).

A message is the same message on a second import when its flow, session, time, role
and text are: nothing is written twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidInput
from core.validation import validate_node_id, validate_session_id
from ingestion.portability.common import Ids, bad, iso, old_id, text, when
from memories.conversations.models import ConversationSummary, Flow, Message
from memories.conversations.node_memory.services import (
    node_memory_document_restore,
    node_memory_documents,
)

ROLES = {choice for choice, _ in Message.Role.choices}


def export(owner_id: int) -> Iterator[dict[str, Any]]:
    for flow in Flow.objects.filter(owner_id=owner_id).order_by("name"):
        yield {"type": "flow", "id": str(flow.pk), "name": flow.name}
    messages = (
        Message.objects.filter(owner_id=owner_id)
        .select_related("flow")
        .order_by("flow__name", "session_id", "created_at", "id")
    )
    for m in messages.iterator(chunk_size=2000):
        yield {
            "type": "message", "id": str(m.pk), "flow": str(m.flow_id),
            "session_id": m.session_id, "message_id": m.message_id, "run_id": m.run_id,
            "is_output": m.is_output, "role": m.role, "sender": m.sender,
            "sender_name": m.sender_name, "text": m.text, "content": m.content,
            "files": m.files, "parent": str(m.parent_id) if m.parent_id else None,
            "starts_thread": m.starts_thread, "created_at": iso(m.created_at),
        }  # fmt: skip
    for flow in Flow.objects.filter(owner_id=owner_id).order_by("name"):
        for doc in node_memory_documents(flow=flow):
            yield {"type": "node_memory", "flow": str(flow.pk), "document": doc}
    for s in ConversationSummary.objects.filter(owner_id=owner_id).order_by("key"):
        yield {
            "type": "summary", "key": s.key, "text": s.text, "summarized_ids": s.summarized_ids,
            "last_summarized_id": s.last_summarized_id, "token_count": s.token_count,
            "version": s.version,
        }  # fmt: skip


@dataclass
class Conversations:
    flows: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    message_ids: set[str] = field(default_factory=set)
    types = ("flow", "message", "summary", "node_memory")

    def parse(self, obj: dict[str, Any], line: int) -> None:
        kind = obj["type"]
        if kind == "flow":
            name = text(obj, "name", line, blank=False, limit=200)
            self.flows[old_id(obj.get("id"), line)] = {"line": line, "name": name}
        elif kind == "message":
            role = obj.get("role")
            if role not in ROLES:
                raise bad(line, f"role {role!r} is not one of {', '.join(sorted(ROLES))}")
            flow = old_id(obj.get("flow"), line, "flow")
            if flow not in self.flows:
                raise bad(line, f"flow {flow} is not a flow line before it")
            for name in ("content", "files"):
                if not isinstance(obj.get(name, []), list):
                    raise bad(line, f"{name} is not a list")
            # (a parent naming no earlier line was imported as no parent, silently)
            parent = obj.get("parent") or None
            if parent is not None and str(parent) not in self.message_ids:
                raise bad(line, f"parent {parent} is not a message line before it")
            self.messages.append({
                "line": line, "id": old_id(obj.get("id"), line), "flow": flow,
                "session_id": text(obj, "session_id", line, blank=False, limit=255),
                "message_id": obj.get("message_id") if isinstance(obj.get("message_id"), str)
                else None,
                "run_id": text(obj, "run_id", line, limit=64), "is_output": bool(obj.get("is_output")),
                "role": role, "sender": text(obj, "sender", line, limit=100),
                "sender_name": text(obj, "sender_name", line, limit=200),
                "text": text(obj, "text", line), "content": obj.get("content") or [],
                "files": obj.get("files") or [], "parent": parent,
                "starts_thread": bool(obj.get("starts_thread")),
                "created_at": when(obj.get("created_at"), line, "created_at", True),
            })  # fmt: skip
            self.message_ids.add(self.messages[-1]["id"])
        elif kind == "node_memory":
            flow = old_id(obj.get("flow"), line, "flow")
            doc = obj.get("document")
            if flow not in self.flows:
                raise bad(line, f"flow {flow} is not a flow line before it")
            if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
                raise bad(line, "document is not a node memory document")
            try:
                validate_session_id(doc.get("session_id"))
                validate_node_id(doc.get("node_id"))
            except InvalidInput as exc:
                raise bad(line, str(exc)) from None
            self.nodes.append({"line": line, "flow": flow, "document": doc})
        else:
            ids = obj.get("summarized_ids") or []
            if not isinstance(ids, list):
                raise bad(line, "summarized_ids is not a list")
            self.summaries.append({
                "line": line, "key": text(obj, "key", line, blank=False, limit=800),
                "text": text(obj, "text", line), "summarized_ids": ids,
                "last_summarized_id": text(obj, "last_summarized_id", line, limit=255),
                "token_count": int(obj.get("token_count") or 0),
                "version": int(obj.get("version") or 0),
            })  # fmt: skip

    def check(self, owner_id: int, ids: Ids) -> None:
        """A flow name the owner already uses for another flow: the line is bad."""
        for old, flow in self.flows.items():
            other = Flow.objects.filter(owner_id=owner_id, name=flow["name"]).first()
            if other is not None and other.pk != ids.new("flow", old):
                raise bad(flow["line"], f"a flow named {flow['name']!r} already exists")

    def write(self, owner_id: int, ids: Ids) -> dict[str, int]:
        counts = {"flows": 0, "messages": 0, "summaries": 0, "node_memories": 0}
        for old, flow in self.flows.items():
            _, created = Flow.objects.get_or_create(
                pk=ids.new("flow", old), defaults={"owner_id": owner_id, "name": flow["name"]}
            )
            counts["flows"] += created
        pks: dict[str, int] = {}
        for m in self.messages:
            flow_id = ids.new("flow", m["flow"])
            same = Message.objects.filter(
                flow_id=flow_id, session_id=m["session_id"], created_at=m["created_at"],
                role=m["role"], text=m["text"],
            ).first()  # fmt: skip
            if same is None:
                parent = pks[str(m["parent"])] if m["parent"] is not None else None
                same = Message.objects.create(
                    owner_id=owner_id, flow_id=flow_id, parent_id=parent,
                    **{k: m[k] for k in ("session_id", "message_id", "run_id", "is_output",
                                         "role", "sender", "sender_name", "text", "content",
                                         "files", "starts_thread", "created_at")},
                )  # fmt: skip
                counts["messages"] += 1
            pks[m["id"]] = same.pk
        ids.known.update({("message", old): pk for old, pk in pks.items()})
        for node in self.nodes:
            row = Flow.objects.get(pk=ids.new("flow", node["flow"]))
            counts["node_memories"] += node_memory_document_restore(flow=row, doc=node["document"])
        for s in self.summaries:
            key = _renamed_key(s["key"], ids, self.flows)
            values = {k: s[k] for k in ("text", "summarized_ids", "last_summarized_id",
                                        "token_count", "version")}  # fmt: skip
            _, created = ConversationSummary.objects.get_or_create(
                owner_id=owner_id, key=key, defaults=values
            )
            counts["summaries"] += created
        return counts


def _renamed_key(key: str, ids: Ids, flows: dict[str, Any]) -> str:
    """``flow:<old id>:<session>`` names the imported flow's new id."""
    kind, sep, rest = key.partition(":")
    if kind != "flow" or not sep:
        return key
    old, sep, session = rest.partition(":")
    if old not in flows:
        return key
    return f"flow:{ids.new('flow', old)}:{session}"
