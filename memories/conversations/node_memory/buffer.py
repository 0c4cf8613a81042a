"""In-process memory objects: ``memory_for`` returns a conversation or node buffer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.utils import timezone

from memories.conversations.history import (
    History,
    TokenBufferMemory,
    validate_budget,
)
from memories.conversations.models import Flow
from memories.conversations.node_memory.documents import (
    _apply_turns,
    _history,
    _mutable,
    _new_doc,
    _now_iso,
    _read,
)
from memories.conversations.node_memory.services import (
    node_memory_append_turns,
    node_memory_clear,
)
from memories.conversations.node_memory.values import (
    LATEST,
    MemoryConfigurationError,
    NodeMemoryNotFound,
    NodeTurn,
    Parent,
    TurnIn,
    _turn_in,
    node_key,
)


# --- in-process memory objects ------------------------------------------------------
class NodeTokenBufferMemory:
    """The seed's NodeTokenBufferMemory: buffered turns, persisted by ``flush()``.

    ``get_history`` sees the stored turns and the buffered ones; a node that has no
    document yet has an empty history.
    """

    def __init__(self, *, flow: Flow, conversation_id: str, node_id: str):
        self.flow = flow
        self.key = node_key(flow=flow, session_id=conversation_id, node_id=node_id)
        self._pending: list[TurnIn] = []

    def add_messages(
        self,
        *,
        message_id: str,
        parent_message_id: str | None | Parent = LATEST,
        user_content: str,
        assistant_content: str,
        user_files: Sequence[dict[str, Any]] = (),
        assistant_files: Sequence[dict[str, Any]] = (),
    ) -> None:
        self._pending.append(
            _turn_in(
                message_id=message_id,
                parent_message_id=parent_message_id,
                user_content=user_content,
                assistant_content=assistant_content,
                user_files=list(user_files),
                assistant_files=list(assistant_files),
            )
        )

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> list[NodeTurn]:
        """Persist the buffered turns in one locked write, all or none."""
        if not self._pending:
            return []
        results = node_memory_append_turns(
            flow=self.flow,
            session_id=self.key.session_id,
            node_id=self.key.node_id,
            turns=self._pending,
        )
        self._pending = []
        return results

    def get_history(
        self, *, current_message_id: str | None = None, max_token_limit: int | None = None
    ) -> History:
        max_tokens = settings.HISTORY_MAX_TOKENS if max_token_limit is None else max_token_limit
        validate_budget(max_tokens=max_tokens)
        doc = _mutable(_read(self.key) or _new_doc(self.key, ""))
        if self._pending:
            _apply_turns(doc, self._pending, _now_iso(timezone.now()))
        if not doc["messages"] and current_message_id is None:
            return History(items=[], token_count=0, max_tokens=max_tokens, thread_length=0)
        return _history(doc["messages"], current_message_id, max_tokens)

    def get_history_prompt_messages(self, **kwargs: Any) -> list[dict[str, str]]:
        return self.get_history(**kwargs).as_messages()

    def clear(self) -> None:
        self._pending = []
        try:
            node_memory_clear(
                flow=self.flow, session_id=self.key.session_id, node_id=self.key.node_id
            )
        except NodeMemoryNotFound:
            pass


class MemoryMode(StrEnum):
    CONVERSATION = "conversation"
    NODE = "node"


@dataclass(frozen=True)
class MemoryConfig:
    """How an LLM node remembers: the whole conversation, or its own turns."""

    mode: MemoryMode = MemoryMode.CONVERSATION
    message_limit: int | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", MemoryMode(self.mode))
        except ValueError:
            raise MemoryConfigurationError(
                f"memory mode must be 'conversation' or 'node', not {self.mode!r}"
            ) from None


def memory_for(
    config: MemoryConfig, *, flow: Flow, conversation_id: str | None, node_id: str | None = None
) -> TokenBufferMemory | NodeTokenBufferMemory:
    """The memory object for a node execution, or ``MemoryConfigurationError``.

    Never falls back silently: node memory without a conversation (e.g. a workflow
    run outside a chat) or without a node id is an error, as is conversation memory
    without a conversation.
    """
    if config.mode is MemoryMode.NODE:
        if not conversation_id:
            raise MemoryConfigurationError(
                "node memory needs a conversation id: mode 'node' keeps one history per "
                "(flow, conversation, node), and this execution has no conversation. Run "
                "the node in a conversation, or configure mode 'conversation' or no memory."
            )
        if not node_id:
            raise MemoryConfigurationError("node memory needs a node id")
        return NodeTokenBufferMemory(flow=flow, conversation_id=conversation_id, node_id=node_id)
    if not conversation_id:
        raise MemoryConfigurationError(
            "conversation memory needs a conversation id; configure no memory for runs "
            "outside a conversation"
        )
    return TokenBufferMemory(
        flow=flow, conversation_id=conversation_id, message_limit=config.message_limit
    )
