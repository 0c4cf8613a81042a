"""Conversation memory: the current thread of a conversation, cut to a token budget.

A conversation is ``(flow, session_id)`` over the Message table. The history of a
message is its thread (the chain of ``parent_message_id`` back to the root, so that
after a regeneration only the current branch is used), cut to a token budget by
whole turns, newest kept (Dify's ``TokenBufferMemory``).

Thread: a message names its parent (the caller's ``message_id`` or the server id), or
has an explicit null parent, which makes it the root of its thread; a message recorded
without a parent (or with Dify's ``UUID_NIL``) follows the one recorded just before it,
so history recorded without parents is one linear thread.

Pending answers: an assistant message with no content (no text, no image), an answer
still being generated, is left out of the history together with the user message it
answers (Dify skips a message whose answer is empty).

Token budget, for conversation and node memory alike: the history is measured as the
chat transcript it becomes, ``core.providers.tokens.count_message_tokens`` of the
returned ``[{"role", "content"}]`` list: 3 priming tokens, plus per message 3 +
tokens(role) + tokens(content). File references and images are not counted. Each
item's own ``token_count`` is tokens(content) alone (what node memory stores, as the
seed does). Truncation drops whole turns, oldest first: a turn is a user message and
the messages after it up to the next user message, so no answer is kept without its
question. A newest turn that alone exceeds the budget gives an empty history
(history is optional context; sending it over budget would break the next call).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from operator import itemgetter
from typing import Any, Literal, NamedTuple, TypeVar

from django.conf import settings
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet

from core.errors import ServiceError
from core.providers.tokens import count_tokens
from core.validation import validate_session_id
from memories.conversations.models import Flow, Message

PRIMING_TOKENS = 3  # count_message_tokens' reply priming
PER_MESSAGE_TOKENS = 3  # count_message_tokens' per-message overhead
DEFAULT_HUMAN_PREFIX = "Human"
DEFAULT_AI_PREFIX = "Assistant"
MESSAGE_LIMIT_MAX = 10_000  # a larger message_limit is clamped to this
IMAGE_BLOCK_TYPES_ORDERED = ("image_url", "image", "input_image")
IMAGE_BLOCK_TYPES = frozenset(IMAGE_BLOCK_TYPES_ORDERED)

T = TypeVar("T")
NullParent = Literal["linear", "root"]


# --- errors -------------------------------------------------------------------------
class HistoryError(ServiceError):
    """Bad input to conversation or node memory."""


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
    blocks: list[dict[str, Any]] = field(default_factory=list)  # content blocks as recorded
    id: int | None = None  # the server id (conversation messages)

    @property
    def has_image(self) -> bool:
        return any(block.get("type") in IMAGE_BLOCK_TYPES for block in self.blocks)

    def chat_content(self) -> str | list[dict[str, Any]]:
        """The text, or the content blocks when they hold more than text."""
        if any(block.get("type") != "text" for block in self.blocks):
            return self.blocks
        return self.content

    def text_content(self) -> str:
        """Text blocks as text, an image as ``[image]`` (Dify's transcript)."""
        if not self.has_image:
            return self.content
        parts = []
        for block in self.blocks:
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif block.get("type") in IMAGE_BLOCK_TYPES:
                parts.append("[image]")
        return "\n".join(parts).strip()


@dataclass(frozen=True)
class History:
    """The kept messages, oldest first, and how they were chosen."""

    items: list[HistoryItem]
    token_count: int
    max_tokens: int
    thread_length: int
    message_limit: int | None = None

    @property
    def truncated(self) -> int:
        return self.thread_length - len(self.items)

    def as_messages(self) -> list[dict[str, Any]]:
        """OpenAI chat format (content blocks kept where a message has an image)."""
        return [{"role": item.role, "content": item.chat_content()} for item in self.items]

    def as_text(
        self, *, human_prefix: str = DEFAULT_HUMAN_PREFIX, ai_prefix: str = DEFAULT_AI_PREFIX
    ) -> str:
        """A transcript, one ``Prefix: content`` line per user or assistant message;
        system and tool messages are left out (Dify's ``get_history_prompt_text``)."""
        prefixes = {"user": human_prefix, "assistant": ai_prefix}
        return "\n".join(
            f"{prefixes[item.role]}: {item.text_content()}"
            for item in self.items
            if item.role in prefixes
        )


@lru_cache(maxsize=16)
def _role_tokens(role: str) -> int:
    return count_tokens(role)


def message_cost(role: str, content_tokens: int) -> int:
    """What one message adds to ``count_message_tokens``."""
    return PER_MESSAGE_TOKENS + _role_tokens(role) + content_tokens


_ANY = object()
_END = object()
THREAD_START = object()  # parent(item) for an item that roots its thread


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
    ends the thread, and so does ``THREAD_START``. A null parent means, with
    ``"root"``, that the item starts the thread; with ``"linear"``, that it follows
    the item just before it (history recorded without parents is all one thread).
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
        if expected is THREAD_START or (expected is None and null_parent == "root"):
            expected = _END
        elif expected is None:
            expected = _ANY
    return thread


def _turns(newest_first: Iterable[HistoryItem]) -> Iterator[list[HistoryItem]]:
    """Whole turns, newest first, each oldest first: a user message and what follows
    it up to the next user message (what precedes the first user message is a turn
    of its own)."""
    turn: list[HistoryItem] = []
    for item in newest_first:
        turn.append(item)
        if item.role == "user":
            yield turn[::-1]
            turn = []
    if turn:
        yield turn[::-1]


def history_from_items(
    newest_first: Iterable[HistoryItem],
    *,
    thread_length: int,
    max_tokens: int,
    message_limit: int | None = None,
) -> History:
    """Keep the newest whole turns that fit ``max_tokens`` (see the module docstring).

    ``newest_first`` is consumed only as far as the budget reaches (to the start of
    the first turn that does not fit), so a lazy iterable loads and counts no more
    than what is kept plus one turn.
    """
    kept: list[HistoryItem] = []
    total = PRIMING_TOKENS
    for turn in _turns(newest_first):
        cost = sum(message_cost(item.role, item.token_count) for item in turn)
        if total + cost > max_tokens:
            break
        kept[:0] = turn
        total += cost
    return History(
        items=kept,
        token_count=total if kept else 0,
        max_tokens=max_tokens,
        thread_length=thread_length,
        message_limit=message_limit,
    )


def validate_budget(*, max_tokens: int) -> None:
    if max_tokens < 1:
        raise HistoryError("max_tokens must be at least 1.", details={"max_tokens": max_tokens})


def effective_message_limit(message_limit: int | None) -> int:
    """None or 0: ``HISTORY_MESSAGE_LIMIT``; above ``MESSAGE_LIMIT_MAX``: clamped
    (Dify's ``message_limit`` rules); negative: refused."""
    if message_limit is not None and message_limit < 0:
        raise HistoryError(
            "message_limit must be 0 (the default) or more.",
            details={"message_limit": message_limit},
        )
    return min(message_limit or settings.HISTORY_MESSAGE_LIMIT, MESSAGE_LIMIT_MAX)


# --- conversation memory ------------------------------------------------------------
class _Link(NamedTuple):
    id: int
    parent_id: int | None
    starts_thread: bool
    role: str
    pending: bool


def pending_answer() -> ExpressionWrapper:
    """An assistant message with no text and no image: an answer being generated."""
    no_image = ~Q(content__contains=[{"type": IMAGE_BLOCK_TYPES_ORDERED[0]}])
    for block_type in IMAGE_BLOCK_TYPES_ORDERED[1:]:
        no_image &= ~Q(content__contains=[{"type": block_type}])
    return ExpressionWrapper(
        Q(role=Message.Role.ASSISTANT, text="") & no_image, output_field=BooleanField()
    )


def resolve_message(messages: QuerySet[Message], reference: int | str) -> Message | None:
    """The message a caller names: its own ``message_id`` first, else (digits) the
    server id."""
    if isinstance(reference, str):
        found = messages.filter(message_id=reference).first()
        if found is not None or not _SERVER_ID.fullmatch(reference):
            return found  # (not "²" or "١", which isdigit() takes: ASCII digits that fit)
    if not 0 < int(reference) < 2**63:
        return None
    return messages.filter(pk=int(reference)).first()


_SERVER_ID = re.compile(r"[0-9]{1,19}")


def _candidates(
    flow: Flow, session_id: str, current_message_id: int | str | None, message_limit: int
) -> list[_Link]:
    """At most ``message_limit`` links, newest first, from the current message down:
    one backward scan of the (flow, session_id, created_at, id) index, without the
    texts (most candidates are not in the thread or not in the budget)."""
    messages = Message.objects.filter(flow=flow, session_id=session_id)
    if current_message_id is not None:
        current = resolve_message(messages, current_message_id)
        if current is None:
            raise UnknownMessage(
                f"Message {current_message_id} is not part of conversation {session_id!r}.",
                details={"current_message_id": current_message_id},
            )
        messages = messages.filter(created_at__lte=current.created_at).exclude(
            created_at=current.created_at, id__gt=current.pk
        )
    return [
        _Link(*row)
        for row in messages.order_by("-created_at", "-id")
        .annotate(pending=pending_answer())
        .values_list("id", "parent_id", "starts_thread", "role", "pending")[:message_limit]
    ]


def _without_pending(thread: list[_Link]) -> list[_Link]:
    """Leave out pending answers and the user message each one answers (the thread
    message just before it, when that is a user message)."""
    kept: list[_Link] = []
    skip_question = False
    for link in thread:
        if link.pending:
            skip_question = True
        elif skip_question and link.role == Message.Role.USER:
            skip_question = False
        else:
            skip_question = False
            kept.append(link)
    return kept


def _link_parent(link: _Link) -> Hashable | None:
    return THREAD_START if link.starts_thread else link.parent_id


_CONTENT_FIELDS = (
    "id",
    "message_id",
    "parent_id",
    "parent__message_id",
    "role",
    "text",
    "content",
    "files",
    "created_at",
)


def _thread_items(thread: list[_Link], max_tokens: int) -> Iterator[HistoryItem]:
    """The thread's messages newest first, their contents fetched in batches: the
    first sized for the budget (~40 tokens a message), each next one twice as big."""
    size = min(200, max(16, max_tokens // 40))
    start = 0
    while start < len(thread):
        batch = thread[start : start + size]
        rows = {
            row[0]: row
            for row in Message.objects.filter(pk__in=[link.id for link in batch]).values_list(
                *_CONTENT_FIELDS
            )
        }
        for link in batch:
            if link.id in rows:  # else deleted since the scan
                pk, own_id, parent_pk, parent_own_id, role, text, blocks, files, at = rows[link.id]
                yield HistoryItem(
                    message_id=own_id or pk,
                    parent_message_id=parent_own_id or parent_pk,
                    role=role,
                    content=text,
                    files=files or [],
                    token_count=count_tokens(text),
                    created_at=at,
                    blocks=blocks or [],
                    id=pk,
                )
        start += size
        size *= 2


def conversation_history(
    *,
    flow: Flow,
    session_id: str,
    current_message_id: int | str | None = None,
    max_tokens: int | None = None,
    message_limit: int | None = None,
) -> History:
    """The thread of the current message (default: the newest) of one conversation.

    ``flow`` must come from an owner-scoped lookup. ``current_message_id`` is the
    caller's message id or the server id. Candidates are the conversation's
    ``message_limit`` newest messages up to and including the current one (see
    ``effective_message_limit``); the thread follows the parents from the current
    message (module docstring), pending answers are left out with their questions,
    and whole turns are dropped, oldest first, while the history exceeds
    ``max_tokens`` (default ``HISTORY_MAX_TOKENS``). A conversation without messages
    has an empty history. Raises ``UnknownMessage`` (current message not in the
    conversation) or ``HistoryError`` (bad budget). Reads only.
    """
    max_tokens = settings.HISTORY_MAX_TOKENS if max_tokens is None else max_tokens
    validate_budget(max_tokens=max_tokens)
    limit = effective_message_limit(message_limit)
    validate_session_id(session_id)
    links = _candidates(flow, session_id, current_message_id, limit)
    thread = _without_pending(
        extract_thread(links, key=itemgetter(0), parent=_link_parent, null_parent="linear")
    )
    return history_from_items(
        _thread_items(thread, max_tokens),
        thread_length=len(thread),
        max_tokens=max_tokens,
        message_limit=limit,
    )


class TokenBufferMemory:
    """Conversation-scoped memory for in-process callers (the seed's TokenBufferMemory)."""

    def __init__(self, *, flow: Flow, conversation_id: str, message_limit: int | None = None):
        self.flow = flow
        self.conversation_id = validate_session_id(conversation_id)
        self.message_limit = message_limit

    def get_history(
        self, *, current_message_id: int | str | None = None, max_token_limit: int | None = None
    ) -> History:
        return conversation_history(
            flow=self.flow,
            session_id=self.conversation_id,
            current_message_id=current_message_id,
            max_tokens=max_token_limit,
            message_limit=self.message_limit,
        )

    def get_history_prompt_messages(self, **kwargs: Any) -> list[dict[str, Any]]:
        return self.get_history(**kwargs).as_messages()

    def get_history_prompt_text(
        self,
        *,
        human_prefix: str = DEFAULT_HUMAN_PREFIX,
        ai_prefix: str = DEFAULT_AI_PREFIX,
        **kwargs: Any,
    ) -> str:
        return self.get_history(**kwargs).as_text(human_prefix=human_prefix, ai_prefix=ai_prefix)
