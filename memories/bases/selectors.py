"""Reads for memory bases, their sessions and jobs, always scoped by owner."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.contrib.auth.models import User
from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    IntegerField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce

from core.key_limits import not_owned, resource_check, resource_filter
from knowledge.selectors import chunk_count_subquery, session_has_chunks
from memories.bases.models import MemoryBase, MemoryBaseJob, MemoryBaseSession
from memories.conversations.selectors import pending_outputs_subquery


def memory_base_list(*, owner: User) -> QuerySet[MemoryBase]:
    """Memory bases with their counters, in a fixed number of queries (those a narrowed
    key may reach: core.key_limits)."""
    return with_counters(resource_filter(MemoryBase.objects.filter(owner=owner), "memory_bases"))


def memory_bases_holding() -> QuerySet[MemoryBase]:
    """The memory bases, each keeping a knowledge base of its own
    (``knowledge_base_id``): a key narrowed on memory bases reaches such a base only
    with its memory base (core.key_limits)."""
    return MemoryBase.objects.filter(knowledge_base__isnull=False)


def memory_bases_not_owned(owner_id: int, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Of ``ids``, those that are not the owner's memory bases (core.key_limits)."""
    return not_owned(MemoryBase.objects.filter(owner_id=owner_id), ids)


def with_counters(qs: QuerySet[MemoryBase]) -> QuerySet[MemoryBase]:
    """Annotate sessions, processed total, last sync, active jobs, ``chunk_total`` (rows
    in the knowledge base's chunk table: the one chunk count the API, the admin and
    the commands show) and ``mismatch``."""
    # Sessions that processed messages and should hold chunks: not those whose last
    # finished job wrote none on purpose (a preprocessing kill phrase, only empty answers).
    processed = (
        MemoryBaseSession.objects.filter(memory_base=OuterRef("pk"), total_processed__gt=0)
        .annotate(last_wrote=_last_wrote())
        .exclude(last_wrote=0)
    )
    lost = lost_sessions(MemoryBaseSession.objects.filter(memory_base=OuterRef("pk")))
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
                    MemoryBaseJob.objects.filter(
                        memory_base=OuterRef("pk"), status__in=MemoryBaseJob.ACTIVE
                    )
                    .order_by()
                    .values("memory_base")
                    .annotate(c=Count("id"))
                    .values("c"),
                    output_field=IntegerField(),
                ),
                0,
            ),
            chunk_total=chunk_count_subquery(OuterRef("knowledge_base_id")),
            has_processed=Exists(processed),
            has_lost_session=Exists(lost),
        )
        # Mismatch, defined once: sessions report processed messages (that should have
        # left chunks) but the knowledge base holds no chunks, or one session's chunks
        # are all gone (deleted behind our back: ``lost_sessions``).
        .annotate(
            mismatch=ExpressionWrapper(
                (Q(has_processed=True) & Q(chunk_total=0)) | Q(has_lost_session=True),
                output_field=BooleanField(),
            )
        )
        .order_by("name", "id")
    )


def lost_sessions(qs: QuerySet[MemoryBaseSession]) -> QuerySet[MemoryBaseSession]:
    """The sessions whose chunks are gone: they report processed messages, their last
    finished job wrote chunks, and the knowledge base holds none of them (a job that
    legitimately stored nothing, a preprocessing kill phrase, wrote none)."""
    return (
        qs.filter(total_processed__gt=0)
        .annotate(
            last_wrote=_last_wrote(),
            present=session_has_chunks(
                OuterRef("memory_base__knowledge_base_id"), OuterRef("session_id")
            ),
        )
        .filter(last_wrote__gt=0, present=False)
    )


def _last_wrote() -> Subquery:
    """The chunks the last finished job of the session (``OuterRef("pk")``) wrote (NULL:
    no job finished)."""
    wrote = MemoryBaseJob.objects.filter(
        session=OuterRef("pk"), status=MemoryBaseJob.Status.SUCCEEDED
    )
    return Subquery(wrote.order_by("-created_at").values("chunks_written")[:1])


def memory_base_as_created(memory_base: MemoryBase) -> MemoryBase:
    """A base just created, with the counters ``with_counters`` would find (no
    sessions, jobs or chunks yet), set without a query."""
    memory_base.session_count = 0  # type: ignore[attr-defined]
    memory_base.processed_total = 0  # type: ignore[attr-defined]
    memory_base.last_sync = None  # type: ignore[attr-defined]
    memory_base.active_jobs = 0  # type: ignore[attr-defined]
    memory_base.chunk_total = 0  # type: ignore[attr-defined]
    memory_base.has_processed = False  # type: ignore[attr-defined]
    memory_base.has_lost_session = False  # type: ignore[attr-defined]
    memory_base.mismatch = False  # type: ignore[attr-defined]
    return memory_base


def _session_aggregate(aggregate: object) -> Coalesce:
    per_base = (
        MemoryBaseSession.objects.filter(memory_base=OuterRef("pk"))
        .order_by()
        .values("memory_base")
        .annotate(v=aggregate)
        .values("v")
    )
    return Coalesce(Subquery(per_base, output_field=IntegerField()), 0)


def memory_base_get(*, owner: User, memory_base_id: uuid.UUID | str) -> MemoryBase:
    """MemoryBase.DoesNotExist (a 404) for a missing or another owner's base; one a
    narrowed key may not reach is a 403 (core.key_limits)."""
    memory_base = with_counters(MemoryBase.objects.filter(owner=owner)).get(pk=memory_base_id)
    resource_check("memory_bases", memory_base.pk)
    return memory_base


def memory_base_sessions(*, memory_base: MemoryBase) -> QuerySet[MemoryBaseSession]:
    """Sessions with their pending output count and active job id, in one query."""
    return sessions_with_status(MemoryBaseSession.objects.filter(memory_base=memory_base))


def sessions_with_status(qs: QuerySet[MemoryBaseSession]) -> QuerySet[MemoryBaseSession]:
    active = MemoryBaseJob.objects.filter(session=OuterRef("pk"), status__in=MemoryBaseJob.ACTIVE)
    return qs.annotate(
        lost=Exists(lost_sessions(MemoryBaseSession.objects.filter(pk=OuterRef("pk")))),
        pending=_session_pending(),
        active_job_id=Subquery(active.values("pk")[:1]),
        active_job_status=Subquery(active.values("status")[:1]),
        last_job_status=Subquery(
            MemoryBaseJob.objects.filter(session=OuterRef("pk"))
            .order_by("-created_at")
            .values("status")[:1]
        ),
    ).order_by("session_id")


def session_status(session: Any) -> str:
    """``queued``/``syncing`` (an active job), ``failed`` (the last job), ``mismatch``
    (its chunks are gone: ``lost_sessions``; Regenerate restores them), ``pending`` or
    ``synced``, for a session from ``sessions_with_status``."""
    if session.active_job_id is not None:
        return "syncing" if session.active_job_status == "running" else "queued"
    if session.last_job_status == "failed":
        return "failed"
    if session.lost:
        return "mismatch"
    return "pending" if session.pending else "synced"


def _session_pending() -> Coalesce:
    """Per session row: how many outputs of its flow lie after its cursor."""
    return Coalesce(pending_outputs_subquery(OuterRef("memory_base__flow_id")), 0)


def with_pending_total(qs: QuerySet[MemoryBase]) -> QuerySet[MemoryBase]:
    """Annotate ``pending_total``: the outputs waiting in every session of each memory
    base, summed by the database (the admin's list made one query per row, and a base
    of 2,000 sessions 2,000 rows of five subqueries each to add up)."""
    per_base = (
        MemoryBaseSession.objects.filter(memory_base=OuterRef("pk"))
        .annotate(pending=_session_pending())
        .order_by()
        .values("memory_base")
        .annotate(total=Sum("pending"))
        .values("total")
    )
    return qs.annotate(pending_total=Coalesce(Subquery(per_base, output_field=IntegerField()), 0))


def job_get(*, owner: User, job_id: uuid.UUID | str) -> MemoryBaseJob:
    job = MemoryBaseJob.objects.select_related("session", "memory_base").get(
        memory_base__owner=owner, pk=job_id
    )
    resource_check("memory_bases", job.memory_base_id)
    return job


def memory_base_mismatch(*, memory_base: MemoryBase) -> bool:
    """Whether the memory base's sessions report processed messages but its knowledge
    base holds no chunks (``with_counters`` defines it)."""
    return memory_base_chunk_state(memory_base=memory_base).mismatch


class ChunkState(NamedTuple):
    chunks: int
    mismatch: bool


def memory_base_chunk_state(*, memory_base: MemoryBase) -> ChunkState:
    """The chunk count and mismatch flag ``with_counters`` gives (one definition)."""
    counted: Any = with_counters(MemoryBase.objects.filter(pk=memory_base.pk)).get()
    return ChunkState(counted.chunk_total, counted.mismatch)
