"""Values of node memory: keys, turns, the errors its services raise."""

from __future__ import annotations

import enum
import hashlib
import re
import uuid
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from core.validation import validate_node_id, validate_session_id
from memories.conversations.history import (
    HistoryError,
    HistoryItem,
)
from memories.conversations.models import MESSAGE_ID_MAX, Flow

ROOT = "node_memory"
VERSION = 1
_PLAIN_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_MESSAGE_ID = itemgetter("message_id")
_PARENT_ID = itemgetter("parent_message_id")


class Parent(enum.Enum):
    """``parent_message_id=LATEST``: follow the newest turn of the document."""

    LATEST = "latest"


LATEST = Parent.LATEST


# --- errors -------------------------------------------------------------------------
class NodeMemoryNotFound(HistoryError):
    status_code = 404
    code = "not_found"


class DuplicateMessage(HistoryError):
    status_code = 409
    code = "duplicate_message"


class UnknownParent(HistoryError):
    status_code = 422
    code = "unknown_parent"


class MemoryConfigurationError(HistoryError):
    code = "configuration_error"


# --- values -------------------------------------------------------------------------
@dataclass(frozen=True)
class TurnIn:
    message_id: str
    parent_message_id: str | None | Parent
    user_content: str
    assistant_content: str
    user_files: list[dict[str, Any]] = field(default_factory=list)
    assistant_files: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class NodeTurn:
    message_id: str
    parent_message_id: str | None
    items: list[HistoryItem]
    created: bool


@dataclass(frozen=True)
class NodeKey:
    owner_id: int
    flow_id: uuid.UUID
    session_id: str
    node_id: str

    @property
    def path(self) -> str:
        return f"{ROOT}/{self.flow_id}/{session_segment(self.session_id)}/{self.node_id}.json"


def session_segment(session_id: str) -> str:
    if _PLAIN_SEGMENT_RE.match(session_id):
        return session_id
    return "~" + hashlib.sha256(session_id.encode()).hexdigest()


def node_key(*, flow: Flow, session_id: str, node_id: str) -> NodeKey:
    validate_session_id(session_id)
    validate_node_id(node_id)
    return NodeKey(owner_id=flow.owner_id, flow_id=flow.pk, session_id=session_id, node_id=node_id)


def _turn_in(
    *,
    message_id: Any,
    parent_message_id: Any,
    user_content: Any,
    assistant_content: Any,
    user_files: Any,
    assistant_files: Any,
) -> TurnIn:
    def ident(name: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip() or len(value) > MESSAGE_ID_MAX:
            raise HistoryError(f"{name} must be a non-blank string of at most {MESSAGE_ID_MAX}")
        return value

    def files(name: str, value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, list | tuple) or not all(isinstance(f, dict) for f in value):
            raise HistoryError(f"{name} must be a list of file references")
        return [dict(f) for f in value]

    for name, text in (("user_content", user_content), ("assistant_content", assistant_content)):
        if not isinstance(text, str):
            raise HistoryError(f"{name} must be a string")
    parent = parent_message_id
    if not isinstance(parent, Parent) and parent is not None:
        parent = ident("parent_message_id", parent)
    return TurnIn(
        message_id=ident("message_id", message_id),
        parent_message_id=parent,
        user_content=user_content,
        assistant_content=assistant_content,
        user_files=files("user_files", user_files),
        assistant_files=files("assistant_files", assistant_files),
    )
