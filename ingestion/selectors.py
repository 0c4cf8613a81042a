"""Reads for flows, messages and memory bases, always scoped by owner."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import (
    Count,
    Exists,
    IntegerField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce

from ingestion.models import Flow, IngestionJob, MemoryBase, MemoryBaseSession, Message
from knowledge.models import Chunk

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def flow_list(*, owner: AbstractBaseUser) -> QuerySet[Flow]:
    return Flow.objects.filter(owner=owner).order_by("name", "id")


def flow_get(*, owner: AbstractBaseUser, flow_id: uuid.UUID | str) -> Flow:
    return Flow.objects.get(owner=owner, pk=flow_id)


def message_list(
    *,
    owner: AbstractBaseUser,
    session_id: str | None = None,
    flow: Flow | None = None,
    memory_base: MemoryBase | None = None,
) -> QuerySet[Message]:
    """Messages in keyset order; a memory base resolves to its flow."""
    qs = Message.objects.filter(owner=owner)
    if memory_base is not None:
        qs = qs.filter(flow_id=memory_base.flow_id)
    if flow is not None:
        qs = qs.filter(flow=flow)
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    return qs.order_by("created_at", "id")


def message_get(*, owner: AbstractBaseUser, message_id: int) -> Message:
    return Message.objects.get(owner=owner, pk=message_id)


def _pending_subquery(flow_id_ref: object) -> Subquery:
    cursor_at = Coalesce(OuterRef("cursor_created_at"), Value(_EPOCH))
    cursor_id = Coalesce(OuterRef("cursor_message_id"), Value(-1))
    pending = (
        Message.objects.filter(
            flow_id=flow_id_ref, session_id=OuterRef("session_id"), is_output=True
        )
        .filter(Q(created_at__gte=cursor_at))  # bounds the index range (see services._after)
        .filter(Q(created_at__gt=cursor_at) | Q(created_at=cursor_at, id__gt=cursor_id))
        .order_by()
        .values("session_id")
        .annotate(c=Count("*"))
        .values("c")
    )
    return Subquery(pending, output_field=IntegerField())


def memory_base_list(*, owner: AbstractBaseUser) -> QuerySet[MemoryBase]:
    """Memory bases with their counters, in a fixed number of queries."""
    return with_counters(MemoryBase.objects.filter(owner=owner))


def with_counters(qs: QuerySet[MemoryBase]) -> QuerySet[MemoryBase]:
    """Annotate sessions, processed total, last sync, active jobs and the mismatch inputs."""
    has_chunks = Chunk.objects.filter(knowledge_base_id=OuterRef("knowledge_base_id"))
    processed = MemoryBaseSession.objects.filter(memory_base=OuterRef("pk"), total_processed__gt=0)
    return (
        qs.select_related("flow", "knowledge_base", "owner")
        # Subqueries, not joins: aggregating sessions and jobs through two joins
        # would multiply each session's numbers by its job count.
        .annotate(
            session_count=_session_aggregate(Count("id")),
            processed_total=_session_aggregate(Sum("total_processed")),
            last_sync=Subquery(
                MemoryBaseSession.objects.filter(memory_base=OuterRef("pk"))
                .order_by()
                .values("memory_base")
                .annotate(v=Max("last_sync_at"))
                .values("v")
            ),
            active_jobs=Coalesce(
                Subquery(
                    IngestionJob.objects.filter(
                        memory_base=OuterRef("pk"), status__in=IngestionJob.ACTIVE
                    )
                    .order_by()
                    .values("memory_base")
                    .annotate(c=Count("id"))
                    .values("c"),
                    output_field=IntegerField(),
                ),
                0,
            ),
            has_chunks=Exists(has_chunks),
            has_processed=Exists(processed),
        )
        .order_by("name", "id")
    )


def _session_aggregate(aggregate: object) -> Coalesce:
    per_base = (
        MemoryBaseSession.objects.filter(memory_base=OuterRef("pk"))
        .order_by()
        .values("memory_base")
        .annotate(v=aggregate)
        .values("v")
    )
    return Coalesce(Subquery(per_base, output_field=IntegerField()), 0)


def memory_base_get(*, owner: AbstractBaseUser, memory_base_id: uuid.UUID | str) -> MemoryBase:
    return memory_base_list(owner=owner).get(pk=memory_base_id)


def memory_base_sessions(*, memory_base: MemoryBase) -> QuerySet[MemoryBaseSession]:
    """Sessions with their pending output count and active job id, in one query."""
    return sessions_with_status(MemoryBaseSession.objects.filter(memory_base=memory_base))


def sessions_with_status(qs: QuerySet[MemoryBaseSession]) -> QuerySet[MemoryBaseSession]:
    active = IngestionJob.objects.filter(session=OuterRef("pk"), status__in=IngestionJob.ACTIVE)
    return qs.annotate(
        pending=Coalesce(_pending_subquery(OuterRef("memory_base__flow_id")), 0),
        active_job_id=Subquery(active.values("pk")[:1]),
        active_job_status=Subquery(active.values("status")[:1]),
        last_job_status=Subquery(
            IngestionJob.objects.filter(session=OuterRef("pk"))
            .order_by("-created_at")
            .values("status")[:1]
        ),
    ).order_by("session_id")


def memory_base_pending_total(*, memory_base: MemoryBase) -> int:
    return sum(s.pending for s in memory_base_sessions(memory_base=memory_base))


def job_get(*, owner: AbstractBaseUser, job_id: uuid.UUID | str) -> IngestionJob:
    return IngestionJob.objects.select_related("session", "memory_base").get(
        memory_base__owner=owner, pk=job_id
    )
