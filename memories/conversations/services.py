"""Writes for conversations: flows and the messages of their runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction

from core.db import advisory_xact_lock
from core.errors import InvalidInput, NameTaken
from core.validation import validate_session_id
from memories.conversations.models import Flow, Message


@dataclass(frozen=True)
class MessageIn:
    role: str
    text: str
    content: list[dict[str, Any]] = field(default_factory=list)
    is_output: bool | None = None
    sender: str = ""
    sender_name: str = ""
    files: list[dict[str, Any]] = field(default_factory=list)
    parent_id: int | None = None

    def output(self) -> bool:
        # A message without an explicit flag is an output unless the user wrote it.
        return self.is_output if self.is_output is not None else self.role != "user"


def flow_create(*, owner: User, name: str) -> Flow:
    """Register a flow; names are unique per owner."""
    try:
        with transaction.atomic():
            return Flow.objects.create(owner=owner, name=name)
    except IntegrityError as exc:
        raise NameTaken(f"a flow named {name!r} already exists") from exc


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


def messages_store(
    *, flow: Flow, session_id: str, run_id: str, messages: Sequence[MessageIn]
) -> list[Message]:
    """Store one run's messages, stamped with the database clock under the session's
    lock. Call it inside the caller's transaction: the lock (and so the order of
    the session's messages) holds until that transaction commits."""
    validate_session_id(session_id)
    if not messages:
        raise InvalidInput("a run needs at least one message")
    parent_ids = {m.parent_id for m in messages if m.parent_id is not None}
    with transaction.atomic():
        _session_lock(flow, session_id)
        if parent_ids:
            known = set(
                Message.objects.filter(
                    flow=flow, session_id=session_id, pk__in=parent_ids
                ).values_list("pk", flat=True)
            )
            if known != parent_ids:
                raise InvalidInput(
                    f"parent message(s) {sorted(parent_ids - known)} are not in this session"
                )
        now = _db_now()
        return Message.objects.bulk_create(
            [
                Message(
                    owner_id=flow.owner_id,
                    flow=flow,
                    session_id=session_id,
                    run_id=run_id,
                    is_output=m.output(),
                    role=m.role,
                    sender=m.sender or m.role,
                    sender_name=m.sender_name,
                    text=m.text,
                    content=m.content,
                    files=m.files,
                    parent_id=m.parent_id,
                    created_at=now,
                )
                for m in messages
            ]
        )


def session_messages_delete_rows(*, flow: Flow, session_id: str) -> int:
    """Delete a session's messages (memory bases purge their chunks first:
    ``memories.bases.services.session_messages_delete``)."""
    validate_session_id(session_id)
    deleted, _ = Message.objects.filter(flow=flow, session_id=session_id).delete()
    return deleted
