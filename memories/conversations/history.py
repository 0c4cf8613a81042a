"""Conversation memory: the current thread of a conversation, cut to a token budget.

A conversation is ``(flow, session_id)`` over the Message table. The history of a
message is its thread (the chain of ``parent_message_id`` back to the root, so that
after a regeneration only the current branch is used), newest kept, oldest dropped
while the history exceeds the budget.

Token budget, for conversation and node memory alike: the history is measured as the
chat transcript it becomes, ``core.providers.tokens.count_message_tokens`` of the
returned ``[{"role", "content"}]`` list: 3 priming tokens, plus per message 3 +
tokens(role) + tokens(content). File references are not counted. Each item's own
``token_count`` is tokens(content) alone (what node memory stores, as the seed does).
The newest message is always kept, even if it alone exceeds the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from operator import itemgetter
from typing import Any, Literal, TypeVar

from django.conf import settings

from core.errors import ServiceError
from core.providers.tokens import count_tokens
from core.validation import validate_session_id
from memories.conversations.models import Flow, Message

PRIMING_TOKENS = 3  # count_message_tokens' reply priming
PER_MESSAGE_TOKENS = 3  # count_message_tokens' per-message overhead
DEFAULT_HUMAN_PREFIX = "Human"
DEFAULT_AI_PREFIX = "Assistant"

T = TypeVar("T")
NullParent = Literal["linear", "root"]


# --- errors -------------------------------------------------------------------------
class HistoryError(ServiceError):
    """Bad input to conversation or node memory."""


class ConversationNotFound(HistoryError):
    status_code = 404
    code = "not_found"


class UnknownMessage(HistoryError):
    """A message id that is not part of the conversation (or node memory)."""

    status_code = 422
    code = "unknown_message"


# --- the history --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HistoryItem:
    message_id: int | str
    parent_message_id: int | str | None
    role: str
    content: str
    files: list[dict[str, Any]]
    token_count: int
    created_at: datetime | str


@dataclass(frozen=True)
class History:
    """The kept messages, oldest first, and how they were chosen."""

    items: list[HistoryItem]
    token_count: int
    max_tokens: int
    thread_length: int

    @property
    def truncated(self) -> int:
        return self.thread_length - len(self.items)

    def as_messages(self) -> list[dict[str, str]]:
        """OpenAI chat format."""
        return [{"role": item.role, "content": item.content} for item in self.items]

    def as_text(
        self, *, human_prefix: str = DEFAULT_HUMAN_PREFIX, ai_prefix: str = DEFAULT_AI_PREFIX
    ) -> str:
        """A transcript: one ``Prefix: content`` line per message."""
        prefixes = {"user": human_prefix, "assistant": ai_prefix}
        return "\n".join(
            f"{prefixes.get(item.role, item.role.capitalize())}: {item.content}"
            for item in self.items
        )


@lru_cache(maxsize=16)
def _role_tokens(role: str) -> int:
    return count_tokens(role)


def message_cost(role: str, content_tokens: int) -> int:
    """What one message adds to ``count_message_tokens``."""
    return PER_MESSAGE_TOKENS + _role_tokens(role) + content_tokens


_ANY = object()
_END = object()


def extract_thread(
    newest_first: Iterable[T],
    *,
    key: Callable[[T], Hashable],
    parent: Callable[[T], Hashable | None],
    null_parent: NullParent,
) -> list[T]:
    """The thread of the first item, newest first.

    Walks newest to oldest (Dify's ``extract_thread_messages``): keeps the first
    item, then each item whose key is the parent expected next; consecutive items
    with the same key are one turn (node memory stores a user and an assistant
    message per turn) and are kept together. A parent that is not among the items
    ends the thread. A null parent means, with ``"root"``, that the item starts the
    thread; with ``"linear"``, that it follows the item just before it (history
    recorded without parents is all one thread).
    """
    thread: list[T] = []
    expected: Any = _ANY
    last: Any = _ANY
    for item in newest_first:
        item_key = key(item)
        if item_key == last:
            thread.append(item)
            continue
        if expected is _END:
            break
        if expected is not _ANY and item_key != expected:
            continue
        thread.append(item)
        last = item_key
        expected = parent(item)
        if expected is None:
            expected = _END if null_parent == "root" else _ANY
    return thread


def history_from_items(
    newest_first: Iterable[HistoryItem], *, thread_length: int, max_tokens: int
) -> History:
    """Keep the newest items that fit ``max_tokens`` (the first one always).

    ``newest_first`` is consumed only as far as the budget reaches, so a lazy
    iterable loads and counts no more than what is kept (plus one).
    """
    kept: list[HistoryItem] = []
    total = PRIMING_TOKENS
    for item in newest_first:
        cost = message_cost(item.role, item.token_count)
        if kept and total + cost > max_tokens:
            break
        kept.append(item)
        total += cost
    kept.reverse()
    return History(
        items=kept, token_count=total, max_tokens=max_tokens, thread_length=thread_length
    )


def validate_budget(*, max_tokens: int, message_limit: int | None = None) -> None:
    if max_tokens < 1:
        raise HistoryError("max_tokens must be at least 1", details={"max_tokens": max_tokens})
    if message_limit is not None and message_limit < 1:
        raise HistoryError(
            "message_limit must be at least 1", details={"message_limit": message_limit}
        )


# --- conversation memory ------------------------------------------------------------
_Link = tuple[int, int | None]  # (id, parent id)
_CONTENT_FIELDS = ("id", "role", "text", "files", "created_at")


def _candidates(
    flow: Flow, session_id: str, current_message_id: int | None, message_limit: int
) -> list[_Link]:
    """At most ``message_limit`` (id, parent) pairs, newest first, from the current
    message down: one backward scan of the (flow, session_id, created_at, id) index,
    without the texts (most candidates are not in the thread or not in the budget).
    """
    messages = Message.objects.filter(flow=flow, session_id=session_id)
    if current_message_id is not None:
        current_at = messages.filter(pk=current_message_id).values_list("created_at", flat=True)
        at = current_at.first()
        if at is None:
            if not messages.exists():
                raise ConversationNotFound(f"no conversation {session_id!r} in this flow")
            raise UnknownMessage(
                f"message {current_message_id} is not part of conversation {session_id!r}",
                details={"current_message_id": current_message_id},
            )
        messages = messages.filter(created_at__lte=at).exclude(
            created_at=at, id__gt=current_message_id
        )
    links = list(
        messages.order_by("-created_at", "-id").values_list("id", "parent_id")[:message_limit]
    )
    if not links:
        raise ConversationNotFound(f"no conversation {session_id!r} in this flow")
    return links


def _thread_items(thread: list[_Link], max_tokens: int) -> Iterator[HistoryItem]:
    """The thread's messages newest first, their contents fetched in batches: the
    first sized for the budget (~40 tokens a message), each next one twice as big."""
    size = min(200, max(16, max_tokens // 40))
    start = 0
    while start < len(thread):
        batch = thread[start : start + size]
        rows = {
            row[0]: row
            for row in Message.objects.filter(pk__in=[pk for pk, _ in batch]).values_list(
                *_CONTENT_FIELDS
            )
        }
        for pk, parent_id in batch:
            if pk in rows:  # else deleted since the scan
                _, role, text, files, created_at = rows[pk]
                yield HistoryItem(
                    message_id=pk,
                    parent_message_id=parent_id,
                    role=role,
                    content=text,
                    files=files or [],
                    token_count=count_tokens(text),
                    created_at=created_at,
                )
        start += size
        size *= 2


def conversation_history(
    *,
    flow: Flow,
    session_id: str,
    current_message_id: int | None = None,
    max_tokens: int | None = None,
    message_limit: int | None = None,
) -> History:
    """The thread of the current message (default: the newest) of one conversation.

    ``flow`` must come from an owner-scoped lookup. Candidates are the conversation's
    ``message_limit`` newest messages up to and including the current one (default
    ``HISTORY_MESSAGE_LIMIT``); the thread follows ``parent_message_id`` from the
    current message, a message without a parent following the one recorded just
    before it; the oldest messages are dropped while the history exceeds
    ``max_tokens`` (default ``HISTORY_MAX_TOKENS``; see the module docstring for
    what is counted), the current message is always kept. Raises
    ``ConversationNotFound`` (no messages), ``UnknownMessage`` (current message not
    in the conversation) or ``HistoryError`` (bad budget). Reads only.
    """
    max_tokens = settings.HISTORY_MAX_TOKENS if max_tokens is None else max_tokens
    message_limit = settings.HISTORY_MESSAGE_LIMIT if message_limit is None else message_limit
    validate_budget(max_tokens=max_tokens, message_limit=message_limit)
    validate_session_id(session_id)
    links = _candidates(flow, session_id, current_message_id, message_limit)
    thread = extract_thread(links, key=itemgetter(0), parent=itemgetter(1), null_parent="linear")
    return history_from_items(
        _thread_items(thread, max_tokens), thread_length=len(thread), max_tokens=max_tokens
    )


class TokenBufferMemory:
    """Conversation-scoped memory for in-process callers (the seed's TokenBufferMemory)."""

    def __init__(self, *, flow: Flow, conversation_id: str, message_limit: int | None = None):
        self.flow = flow
        self.conversation_id = validate_session_id(conversation_id)
        self.message_limit = message_limit

    def get_history(
        self, *, current_message_id: int | None = None, max_token_limit: int | None = None
    ) -> History:
        return conversation_history(
            flow=self.flow,
            session_id=self.conversation_id,
            current_message_id=current_message_id,
            max_tokens=max_token_limit,
            message_limit=self.message_limit,
        )

    def get_history_prompt_messages(self, **kwargs: Any) -> list[dict[str, str]]:
        return self.get_history(**kwargs).as_messages()
