"""Reads for personal memories, scoped by owner and end user."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone
from pgvector.django import CosineDistance

from core.scoring import decay
from knowledge.bm25 import bm25_adhoc
from knowledge.fusion import weighted_scores
from memories.personal.models import EndUser, MemoryUpdate, UserVector, Vector


@dataclass
class MemoryHit:
    id: uuid.UUID
    content: str
    type: str
    created_at: datetime
    observed_at: datetime
    similarity: float
    score: float


def end_user_find(*, owner: User, external_id: str) -> EndUser | None:
    return EndUser.objects.filter(owner=owner, external_id=external_id).first()


def end_user_list(*, owner: User) -> QuerySet[EndUser]:
    return EndUser.objects.filter(owner=owner).order_by("external_id")


def memory_list(*, end_user: EndUser) -> QuerySet[Vector]:
    """The memories linked to this user, newest first (globals are not linked)."""
    return (
        Vector.objects.filter(owner_id=end_user.owner_id, links__end_user=end_user)
        .defer("embedding")
        .order_by("-created_at", "id")
    )


def memory_get(*, end_user: EndUser, vector_id: uuid.UUID | str) -> Vector:
    """Raises Vector.DoesNotExist unless the vector is linked to this user."""
    return memory_list(end_user=end_user).get(pk=vector_id)


def personal_count(*, end_user: EndUser) -> int:
    return UserVector.objects.filter(end_user=end_user).count()


def global_memory_list(*, owner: User) -> QuerySet[Vector]:
    return (
        Vector.objects.filter(owner=owner, type=Vector.Type.GLOBAL)
        .defer("embedding")
        .order_by("-created_at")
    )


def memory_history(*, end_user: EndUser, vector_id: uuid.UUID | str) -> QuerySet[MemoryUpdate]:
    """Audit rows of this user that created, replaced, changed or removed the vector."""
    return (
        MemoryUpdate.objects.filter(end_user=end_user)
        .filter(Q(old_vector_id=vector_id) | Q(new_vector_id=vector_id))
        .order_by("created_at", "id")
    )


def memory_search(
    *,
    owner_id: int,
    end_user: EndUser | None,
    vector: Sequence[float],
    embedding_model: str,
    top_k: int,
    threshold: float | None = None,
    include_globals: bool = False,
    half_life_days: float | None = None,
    query: str | None = None,
    relative_threshold: float | None = None,
) -> list[MemoryHit]:
    """Nearest memories of ``end_user`` (and global ones when asked), best first.

    Exact cosine ranking: a user's memories are few, and a filtered HNSW scan
    could drop rows. With ``query`` (the text ``vector`` embeds) the ranking is
    hybrid: BM25 over the same memories, fused with the cosine ranking as knowledge
    search fuses its legs (``knowledge.fusion.weighted_scores``), and ``score`` is
    the fused score. ``threshold`` applies to the raw similarity; decay
    (``score * 0.5 ** (age / half_life)``, age from when the fact was said) reorders
    what passes it; ``relative_threshold`` then drops hits scoring under that share
    of the best one's score.
    """
    scope: Any = Q(pk__in=[])
    if end_user is not None:
        scope |= Exists(UserVector.objects.filter(end_user=end_user, vector=OuterRef("pk")))
    if include_globals:
        scope |= Q(type=Vector.Type.GLOBAL)
    pool = top_k if not (half_life_days or query) else max(top_k * 5, 50)
    base = Vector.objects.filter(
        owner_id=owner_id, embedding_model=embedding_model, dimensions=len(vector)
    ).filter(scope)
    distance = CosineDistance("embedding", list(map(float, vector)))
    rows = list(
        base.annotate(distance=distance).order_by("distance", "id").defer("embedding")[:pool]
    )
    fused: dict[uuid.UUID, float] | None = None
    if query:
        sql, params = base.annotate(text=F("content")).values("id", "text").query.sql_with_params()
        keyword = bm25_adhoc(sql, list(params), "english", query, pool)
        seen = {row.pk for row in rows}
        missing = [pk for pk, _ in keyword if pk not in seen]
        rows += list(base.filter(pk__in=missing).annotate(distance=distance).defer("embedding"))
        cosine = [(row.pk, 1.0 - float(row.distance)) for row in rows]
        fused = weighted_scores(cosine, keyword, settings.SEARCH_VECTOR_WEIGHT)
    now = timezone.now()
    hits = []
    for row in rows:
        similarity = 1.0 - float(row.distance)
        if threshold is not None and similarity < threshold:
            continue
        score = similarity if fused is None else fused[row.pk]
        if half_life_days:
            score = score * decay(row.observed_at, half_life_days, now=now)
        hits.append(
            MemoryHit(
                id=row.pk,
                content=row.content,
                type=row.type,
                created_at=row.created_at,
                observed_at=row.observed_at,
                similarity=similarity,
                score=score,
            )
        )
    hits.sort(key=lambda h: (-h.score, str(h.id)))
    if relative_threshold and hits:
        hits = [h for h in hits if h.score >= relative_threshold * hits[0].score]
    return hits[:top_k]
