"""Reads for flows and messages, scoped by owner, and the keyset queries other rooms
use to walk a session's outputs (Memory Base cursors)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, F, IntegerField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from core.key_limits import not_owned, resource_check, resource_filter
from memories.conversations.models import Flow, Message

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def flow_list(*, owner: User) -> QuerySet[Flow]:
    """The owner's flows (those a narrowed key may reach: core.key_limits)."""
    return resource_filter(Flow.objects.filter(owner=owner), "flows").order_by("name", "id")


def flow_get(*, owner: User, flow_id: uuid.UUID | str) -> Flow:
    """Flow.DoesNotExist (a 404) for a missing or another owner's flow; one a narrowed
    key may not reach is a 403 (core.key_limits)."""
    flow = Flow.objects.get(owner=owner, pk=flow_id)
    resource_check("flows", flow.pk)
    return flow


def flows_not_owned(owner_id: int, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Of ``ids``, those that are not the owner's flows (core.key_limits)."""
    return not_owned(Flow.objects.filter(owner_id=owner_id), ids)


def flow_find(*, owner_id: int, name: str) -> Flow | None:
    return Flow.objects.filter(owner_id=owner_id, name=name).first()


def session_has_other_sender(*, flow: Flow, session_id: str, sender: str,
                             role: str = "user") -> bool:  # fmt: skip
    """Whether ``session_id`` of ``flow`` holds a ``role`` message sent by another than
    ``sender``."""
    messages = Message.objects.filter(flow=flow, session_id=session_id, role=role)
    return messages.exclude(sender=sender).exists()


def session_ids_with_sender(*, flow: Flow, sender: str, role: str = "user") -> list[str]:
    """The sessions of ``flow`` with a ``role`` message sent by ``sender``."""
    return list(
        Message.objects.filter(flow=flow, role=role, sender=sender)
        .values_list("session_id", flat=True)
        .distinct()
    )


def message_list(
    *,
    owner: User,
    session_id: str | None = None,
    flow_id: Any = None,
) -> QuerySet[Message]:
    """Messages in keyset order, each with its parent's caller id (``parent_caller_id``)."""
    qs = resource_filter(Message.objects.filter(owner=owner), "flows", "flow_id")
    qs = qs.annotate(parent_caller_id=F("parent__message_id"))
    if flow_id is not None:
        qs = qs.filter(flow_id=flow_id)
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    return qs.order_by("created_at", "id")


def message_get(*, owner: User, message_id: int) -> Message:
    return Message.objects.get(owner=owner, pk=message_id)


def after_keyset(created_at: datetime | None, message_id: int | None) -> Q:
    """Messages after the keyset cursor (created_at, id).

    The redundant ``created_at >= cursor`` lets PostgreSQL bound the index range
    with the cursor; the OR alone is applied as a filter over the whole session.
    """
    if message_id is None:
        return Q()
    return Q(created_at__gte=created_at) & (
        Q(created_at__gt=created_at) | Q(created_at=created_at, id__gt=message_id)
    )


def outputs_after(
    *, flow_id: Any, session_id: str, created_at: datetime | None, message_id: int | None
) -> QuerySet[Message]:
    """A session's outputs after the cursor (created_at, id), unordered."""
    return Message.objects.filter(flow_id=flow_id, session_id=session_id, is_output=True).filter(
        after_keyset(created_at, message_id)
    )


def outputs_in_scope(
    *,
    flow_id: Any,
    session_id: str,
    after: tuple[datetime | None, int | None],
    up_to: tuple[datetime, int],
) -> QuerySet[Message]:
    """A session's outputs in (after, up_to], in keyset order."""
    return (
        outputs_after(
            flow_id=flow_id, session_id=session_id, created_at=after[0], message_id=after[1]
        )
        .exclude(after_keyset(*up_to))
        .order_by("created_at", "id")
    )


def session_has_messages(*, flow_id: Any, session_id: str) -> bool:
    return Message.objects.filter(flow_id=flow_id, session_id=session_id).exists()


def session_ids_with_outputs(*, flow_id: Any) -> set[str]:
    return set(
        Message.objects.filter(flow_id=flow_id, is_output=True)
        .values_list("session_id", flat=True)
        .distinct()
    )


def pending_outputs_subquery(flow_id_ref: Any) -> Subquery:
    """Per outer session row (``session_id``, ``cursor_created_at``,
    ``cursor_message_id``): how many outputs lie after its cursor."""
    cursor_at = Coalesce(OuterRef("cursor_created_at"), Value(_EPOCH))
    cursor_id = Coalesce(OuterRef("cursor_message_id"), Value(-1))
    pending = (
        Message.objects.filter(
            flow_id=flow_id_ref, session_id=OuterRef("session_id"), is_output=True
        )
        .filter(Q(created_at__gte=cursor_at))  # bounds the index range (see after_keyset)
        .filter(Q(created_at__gt=cursor_at) | Q(created_at=cursor_at, id__gt=cursor_id))
        .order_by()
        .values("session_id")
        .annotate(c=Count("*"))
        .values("c")
    )
    return Subquery(pending, output_field=IntegerField())
