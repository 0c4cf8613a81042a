"""Writes for conversations: flows and the messages of their runs."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction

from core.db import advisory_xact_lock
from core.errors import Conflict, InvalidInput, NameTaken, Unprocessable
from core.key_limits import resource_create_check
from core.validation import validate_session_id
from memories.conversations.history import resolve_message
from memories.conversations.models import UUID_NIL, Flow, Message


class Parent(enum.Enum):
    """``MessageIn.parent=PREVIOUS``: the message follows the one recorded before it."""

    PREVIOUS = "previous"


PREVIOUS = Parent.PREVIOUS


class UnknownParent(Unprocessable):
    code = "unknown_parent"


class DuplicateMessage(Conflict):
    code = "duplicate_message"


@dataclass(frozen=True)
class MessageIn:
    """One message to record. ``parent``: ``PREVIOUS`` (omitted, or Dify's
    ``UUID_NIL``) follows the message recorded before it; ``None`` (an explicit null)
    makes the message the root of a new thread; a string or an int names the parent
    by the caller's ``message_id`` or by the server id (see ``resolve_message``)."""

    role: str
    text: str
    content: list[dict[str, Any]] = field(default_factory=list)
    is_output: bool | None = None
    sender: str = ""
    sender_name: str = ""
    files: list[dict[str, Any]] = field(default_factory=list)
    parent: int | str | None | Parent = PREVIOUS
    message_id: str | None = None

    def output(self) -> bool:
        # A message without an explicit flag is an output unless the user wrote it.
        return self.is_output if self.is_output is not None else self.role != "user"


def flow_create(*, owner: User, name: str) -> Flow:
    """Register a flow; names are unique per owner."""
    resource_create_check("flows")
    try:
        with transaction.atomic():
            return Flow.objects.create(owner=owner, name=name)
    except IntegrityError as exc:
        raise NameTaken(f"a flow named {name!r} already exists") from exc


def flow_ensure(*, owner_id: int, name: str) -> Flow:
    """The owner's flow named ``name``, created on first use (race-safe)."""
    found = Flow.objects.filter(owner_id=owner_id, name=name).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            return Flow.objects.create(owner_id=owner_id, name=name)
    except IntegrityError:  # created meanwhile by another request
        return Flow.objects.get(owner_id=owner_id, name=name)


def session_lock(flow: Flow, session_id: str) -> None:
    """Hold the (flow, session)'s lock until the transaction ends: what is read of the
    session then stays true until its messages are stored (``messages_store`` takes the
    same lock)."""
    _session_lock(flow, session_id)


def _session_lock(flow: Flow, session_id: str) -> None:
    """Serialise captures of one (flow, session) until the transaction ends.

    With the lock held, ``created_at`` is read from the database clock, so within a
    session the keyset (created_at, id) grows in commit order and a cursor can
    never pass a message that commits later.
    """
    advisory_xact_lock(f"{flow.pk}:{session_id}")


def _db_now() -> datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def _check_caller_ids(flow: Flow, session_id: str, messages: Sequence[MessageIn]) -> None:
    ids: list[str] = [m.message_id for m in messages if m.message_id is not None]
    nil = next((i for i, m in enumerate(messages) if m.message_id == UUID_NIL), None)
    if nil is not None:
        raise InvalidInput.at(f"messages[{nil}].message_id",
                              f"may not be {UUID_NIL} (it means 'no parent').")  # fmt: skip
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    taken = Message.objects.filter(flow=flow, session_id=session_id, message_id__in=ids)
    taken_ids = repeated or sorted(str(i) for i in taken.values_list("message_id", flat=True))
    if taken_ids:
        raise DuplicateMessage(
            f"Message id {', '.join(taken_ids)} is already used in conversation {session_id!r}.",
            details={"message_id": taken_ids},
        )


@dataclass(frozen=True)
class _ParentLink:
    pk: int | None = None  # a stored parent
    index: int | None = None  # an earlier message of the same run
    caller_id: str | None = None  # the parent's own message_id
    starts_thread: bool = False


def _parent_of(
    flow: Flow, session_id: str, message: MessageIn, earlier: dict[str, int]
) -> _ParentLink:
    ref = message.parent
    if ref is PREVIOUS or ref == UUID_NIL:
        return _ParentLink()
    if ref is None:
        return _ParentLink(starts_thread=True)
    assert isinstance(ref, int | str)
    if isinstance(ref, str) and ref in earlier:
        return _ParentLink(index=earlier[ref], caller_id=ref)
    found = resolve_message(Message.objects.filter(flow=flow, session_id=session_id), ref)
    if found is None:
        raise UnknownParent(
            f"Parent message {ref!r} is not in conversation {session_id!r}; a message can "
            "only follow a message recorded before it.",
            details={"parent_message_id": ref},
        )
    return _ParentLink(pk=found.pk, caller_id=found.message_id)


def messages_store(
    *, flow: Flow, session_id: str, run_id: str, messages: Sequence[MessageIn]
) -> list[Message]:
    """Store one run's messages, stamped with the database clock under the session's
    lock. Call it inside the caller's transaction: the lock (and so the order of
    the session's messages) holds until that transaction commits.

    A parent is a message of the conversation stored before, or an earlier message of
    the same run named by its caller id (``UnknownParent``, 422, otherwise); caller ids
    are unique within the conversation (``DuplicateMessage``, 409). Nothing is stored
    on any error."""
    validate_session_id(session_id)
    if not messages:
        raise InvalidInput("A run needs at least one message.")
    # No savepoint when the caller's transaction is open (capture): one statement less
    # each way per run, and the caller's transaction is what the lock must span.
    with transaction.atomic(savepoint=False):
        _session_lock(flow, session_id)
        _check_caller_ids(flow, session_id, messages)
        earlier: dict[str, int] = {}
        parents: list[_ParentLink] = []
        for index, m in enumerate(messages):
            parents.append(_parent_of(flow, session_id, m, earlier))
            if m.message_id is not None:
                earlier[m.message_id] = index
        now = _db_now()
        stored = Message.objects.bulk_create(
            [
                Message(
                    owner_id=flow.owner_id,
                    flow=flow,
                    session_id=session_id,
                    run_id=run_id,
                    message_id=m.message_id,
                    is_output=m.output(),
                    role=m.role,
                    sender=m.sender or m.role,
                    sender_name=m.sender_name,
                    text=m.text,
                    content=m.content,
                    files=m.files,
                    parent_id=parent.pk,
                    starts_thread=parent.starts_thread,
                    created_at=now,
                )
                for m, parent in zip(messages, parents, strict=True)
            ]
        )
        in_batch = []
        for message, parent in zip(stored, parents, strict=True):
            message.parent_caller_id = parent.caller_id  # type: ignore[attr-defined]
            if parent.index is not None:
                message.parent = stored[parent.index]
                in_batch.append(message)
        if in_batch:
            Message.objects.bulk_update(in_batch, ["parent"])
        return stored


def sessions_delete_rows(*, flow: Flow, session_ids: Sequence[str]) -> int:
    """Delete every message of these sessions of ``flow`` (the chat proxy's erasure)."""
    deleted, _ = Message.objects.filter(flow=flow, session_id__in=list(session_ids)).delete()
    return deleted
