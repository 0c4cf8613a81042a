"""Reads for personal memories, scoped by owner and end user."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, User
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone
from pgvector.django import CosineDistance

from core.health import pgvector_supports_iterative_scan, pgvector_version
from core.scoring import decay
from knowledge.bm25 import bm25_adhoc
from knowledge.fusion import weighted_scores
from knowledge.models import INDEXED_DIMENSIONS
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
    relevant: bool = True  # retrieved for the query (not only injected by confidence)


def end_user_find(*, owner: User, external_id: str) -> EndUser | None:
    return EndUser.objects.filter(owner=owner, external_id=external_id).first()


def end_user_list(*, owner: User) -> QuerySet[EndUser]:
    """The owner's end users (the ``["user", <id>]`` scopes)."""
    return EndUser.objects.filter(owner=owner, external_id__isnull=False).order_by("external_id")


def scopes_of_owner(*, owner_id: int, limit: int = 100) -> list[list[str]]:
    """The owner's scopes, the most recently created first."""
    return list(
        EndUser.objects.filter(owner_id=owner_id)
        .order_by("-created_at", "-id")
        .values_list("scope", flat=True)[:limit]
    )


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

    The user's facts are read from their scope's range of the covering index
    (``scope_vector_ranking``: exact cosine, whatever the owner's other users hold),
    the owner's global memories by an exact scan of their own. With ``query`` (the
    text ``vector`` embeds) the ranking is hybrid: BM25 over the same memories, fused
    with the cosine ranking as knowledge search fuses its legs
    (``knowledge.fusion.weighted_scores``), and ``score`` is the fused score.
    ``threshold`` applies to the raw similarity; decay (``score * 0.5 ** (age /
    half_life)``, age from when the fact was said) reorders what passes it;
    ``relative_threshold`` then drops hits scoring under that share of the best one's.
    """
    pool = top_k if not (half_life_days or query) else max(top_k * 5, 50)
    cosine: list[tuple[uuid.UUID, float]] = []
    if end_user is not None:
        cosine += scope_vector_ranking(
            scope_id=end_user.pk, vector=vector, embedding_model=embedding_model, limit=pool
        )
    globals_ = Vector.objects.filter(
        owner_id=owner_id,
        type=Vector.Type.GLOBAL,
        embedding_model=embedding_model,
        dimensions=len(vector),
    )
    distance = CosineDistance("embedding", list(map(float, vector)))
    if include_globals:
        rows = globals_.annotate(distance=distance).order_by("distance", "id")
        cosine += [(pk, 1.0 - float(d)) for pk, d in rows.values_list("id", "distance")[:pool]]
    cosine.sort(key=lambda r: (-r[1], str(r[0])))
    cosine = cosine[:pool]
    fused: dict[uuid.UUID, float] | None = None
    if query:
        scope: Any = Q(pk__in=[])
        if end_user is not None:
            scope |= Q(scope_id=end_user.pk) | Exists(
                UserVector.objects.filter(end_user=end_user, shared=True, vector=OuterRef("pk"))
            )
        if include_globals:
            scope |= Q(type=Vector.Type.GLOBAL)
        base = Vector.objects.filter(
            owner_id=owner_id, embedding_model=embedding_model, dimensions=len(vector)
        ).filter(scope)
        sql, params = base.annotate(text=F("content")).values("id", "text").query.sql_with_params()
        keyword = bm25_adhoc(sql, list(params), "english", query, pool)
        seen = {pk for pk, _ in cosine}
        missing = [pk for pk, _ in keyword if pk not in seen]
        extra = base.filter(pk__in=missing).annotate(distance=distance)
        cosine += [(pk, 1.0 - float(d)) for pk, d in extra.values_list("id", "distance")]
        fused = weighted_scores(cosine, keyword, settings.SEARCH_VECTOR_WEIGHT)
    ranked = [(pk, sim) for pk, sim in cosine if threshold is None or sim >= threshold]
    rows_by_id = {
        v.pk: v for v in Vector.objects.filter(pk__in=[r[0] for r in ranked]).defer("embedding")
    }
    now = timezone.now()
    hits = []
    for pk, similarity in ranked:
        row = rows_by_id.get(pk)
        if row is None:
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


# --- Core facts of a scope (the engine's core tier) ----------------------------------
# A scope's facts are the vectors whose ``scope`` is that scope (one range of the
# covering index ``vector_scope_covering``: ranking never visits the heap) plus the
# shared ones reached through its ``shared`` links (few). Both legs are exact: a scope
# holds at most ``ENGINE_MAX_FACTS`` facts, and an exact scan returns every match.

_SHARED_JOIN = (
    "memories_uservector uv JOIN memories_vector v ON v.id = uv.vector_id "
    "WHERE uv.end_user_id = %s AND uv.shared AND v.scope_id IS NULL"
)


@dataclass
class FactFilter:
    categories: list[str] | None = None
    min_confidence: float | None = None

    def sql(self, alias: str = "") -> tuple[str, list[Any]]:
        parts: list[str] = []
        params: list[Any] = []
        if self.categories:
            parts.append(f"{alias}category = ANY(%s)")
            params.append(list(self.categories))
        if self.min_confidence is not None:
            parts.append(f"{alias}confidence >= %s")
            params.append(self.min_confidence)
        return "".join(f" AND {p}" for p in parts), params


def scope_vector_ranking(
    *,
    scope_id: int,
    vector: Sequence[float],
    embedding_model: str,
    limit: int,
    filter: FactFilter | None = None,
) -> list[tuple[uuid.UUID, float]]:
    """[(fact id, cosine similarity)] of the scope's facts, most similar first (exact)."""
    where, fparams = (filter or FactFilter()).sql()
    vwhere, vparams = (filter or FactFilter()).sql("v.")
    text = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    sql = (
        "WITH q AS (SELECT %s::vector AS v) "
        "SELECT id, d FROM ("
        " SELECT id, embedding <=> q.v AS d FROM memories_vector, q"
        f" WHERE scope_id = %s AND dimensions = %s AND embedding_model = %s{where}"
        " UNION ALL"
        f" SELECT v.id, v.embedding <=> q.v FROM q, {_SHARED_JOIN}"
        f" AND v.dimensions = %s AND v.embedding_model = %s{vwhere}"
        ") ranked ORDER BY d, id LIMIT %s"
    )
    params = [text, scope_id, len(vector), embedding_model, *fparams,
              scope_id, len(vector), embedding_model, *vparams, limit]  # fmt: skip
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [(row[0], 1.0 - float(row[1])) for row in cur.fetchall()]


@functools.cache
def _iterative_scan() -> bool:
    return pgvector_supports_iterative_scan(pgvector_version())


def scope_is_large(*, scope_id: int, above: int) -> bool:
    """Whether the scope has more than ``above`` facts: reads at most ``above + 1`` of
    its links (small index entries, not the covering index's vectors)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM (SELECT 1 FROM memories_uservector WHERE end_user_id = %s "
            "LIMIT %s) s",
            [scope_id, above + 1],
        )
        row = cur.fetchone()
    return bool(row and row[0] > above)


def scope_nearest_indexed(
    *, scope_id: int, vector: Sequence[float], embedding_model: str
) -> tuple[uuid.UUID, float] | None:
    """The scope's own fact nearest to ``vector`` through the HNSW index (see
    ``scope_vector_ranking_indexed``); None when the index finds nothing (the caller
    then scans exactly). A near duplicate is near: the approximation does not miss it."""
    ranked = scope_vector_ranking_indexed(
        scope_id=scope_id, vector=vector, embedding_model=embedding_model, limit=1
    )
    return ranked[0] if ranked else None


def scope_vector_ranking_indexed(
    *,
    scope_id: int,
    vector: Sequence[float],
    embedding_model: str,
    limit: int,
    filter: FactFilter | None = None,
) -> list[tuple[uuid.UUID, float]]:
    """``scope_vector_ranking`` for large scopes: the scope's own facts through the HNSW
    index of the dimension, filtered to the scope (pgvector's iterative scan, strict
    order, walks on until ``limit`` facts of the scope are found; approximate), plus its
    shared facts ranked exactly (few). Fewer than ``limit`` rows only when the scope
    has fewer facts or the walk hit ``SEARCH_MAX_SCAN_TUPLES``: callers then rank
    exactly. Empty for a dimension without an index."""
    dims = len(vector)
    if dims not in INDEXED_DIMENSIONS:
        return []
    where, fparams = (filter or FactFilter()).sql()
    vwhere, vparams = (filter or FactFilter()).sql("v.")
    text = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    sql = (
        "SELECT id, d FROM ("
        f" (SELECT id, embedding::vector({dims}) <=> %s::vector({dims}) AS d"
        f" FROM memories_vector WHERE dimensions = {dims} AND scope_id = %s"
        f" AND embedding_model = %s{where} ORDER BY d LIMIT %s)"
        " UNION ALL"
        f" (SELECT v.id, v.embedding <=> %s::vector FROM {_SHARED_JOIN}"
        f" AND v.dimensions = %s AND v.embedding_model = %s{vwhere})"
        ") ranked ORDER BY d, id LIMIT %s"
    )
    params = [text, scope_id, embedding_model, *fparams, limit,
              text, scope_id, dims, embedding_model, *vparams, limit]  # fmt: skip
    with transaction.atomic(savepoint=False), connection.cursor() as cur:
        ef = max(40, limit)  # pgvector's default; the iterative scan walks on as needed
        if _iterative_scan():
            cur.execute(
                "SELECT set_config('hnsw.ef_search', %s, true), "
                "set_config('hnsw.iterative_scan', 'strict_order', true), "
                "set_config('hnsw.max_scan_tuples', %s, true)",
                [str(ef), str(settings.SEARCH_MAX_SCAN_TUPLES)],
            )
        else:
            cur.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(ef)])
        cur.execute(sql, params)
        return [(row[0], 1.0 - float(row[1])) for row in cur.fetchall()]


def scope_keyword_ranking(
    *, scope_id: int, text: str, limit: int, filter: FactFilter | None = None
) -> list[tuple[uuid.UUID, float]]:
    """[(fact id, ts_rank)] of the scope's facts sharing a word with ``text``, best first.

    Any query word matches (an OR of its English lexemes); the GIN lookup intersects
    them with the scope's own lexeme (``~scope:<id>``, see migration 0003), so it reads
    the scope's matches only, however many facts other scopes hold.
    """
    where, fparams = (filter or FactFilter()).sql()
    vwhere, vparams = (filter or FactFilter()).sql("v.")
    sql = (
        "WITH q AS (SELECT coalesce((SELECT string_agg(quote_literal(l), ' | ') "
        "FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, %s))) l), '')"
        "::tsquery AS words, quote_literal(%s)::tsquery AS scope) "
        "SELECT id, r FROM ("
        " SELECT id, ts_rank(search_vector, q.words) AS r FROM memories_vector, q"
        f" WHERE numnode(q.words) > 0 AND search_vector @@ (q.words && q.scope){where}"
        " UNION ALL"
        f" SELECT v.id, ts_rank(v.search_vector, q.words) FROM q, {_SHARED_JOIN}"
        f" AND numnode(q.words) > 0 AND v.search_vector @@ q.words{vwhere}"
        ") ranked ORDER BY r DESC, id LIMIT %s"
    )
    params = [text, f"~scope:{scope_id}", *fparams, scope_id, *vparams, limit]
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [(row[0], float(row[1])) for row in cur.fetchall()]


def core_fact_count(*, scope: EndUser) -> int:
    """Facts linked to the scope (an index-only count of its links)."""
    return UserVector.objects.filter(end_user=scope).count()


def core_fact_list(*, scope: EndUser, filter: FactFilter | None = None) -> QuerySet[Vector]:
    """The scope's facts, highest confidence first, then newest."""
    qs = Vector.objects.filter(owner_id=scope.owner_id, links__end_user=scope).defer("embedding")
    if filter is not None and filter.categories:
        qs = qs.filter(category__in=filter.categories)
    if filter is not None and filter.min_confidence is not None:
        qs = qs.filter(confidence__gte=filter.min_confidence)
    return qs.order_by("-confidence", "-updated_at", "id")


@dataclass(frozen=True)
class FactRow:
    """A fact as plain values (no model instance: injection reads hundreds at once)."""

    id: uuid.UUID
    content: str
    category: str
    confidence: float
    type: str
    observed_at: datetime
    created_at: datetime
    updated_at: datetime

    @property
    def pk(self) -> uuid.UUID:
        return self.id


_ROW_FIELDS = ("id", "content", "category", "confidence", "type", "observed_at", "created_at",
               "updated_at")  # fmt: skip


def core_fact_rows(*, scope: EndUser) -> list[FactRow]:
    """The scope's facts as ``FactRow``, highest confidence first, then newest."""
    rows = core_fact_list(scope=scope).values_list(*_ROW_FIELDS)
    return [FactRow(*row) for row in rows]


def core_fact_get(*, owner: AbstractBaseUser | int, fact_id: uuid.UUID | str) -> Vector:
    """One of the owner's facts (not a global memory); raises Vector.DoesNotExist."""
    owner_id = int(owner if isinstance(owner, int) else owner.pk)
    return Vector.objects.defer("embedding").get(
        owner_id=owner_id, type=Vector.Type.MEMORY, pk=fact_id
    )


def fact_scopes(*, fact: Vector) -> list[EndUser]:
    """The scopes a fact is linked to."""
    return list(EndUser.objects.filter(links__vector=fact).order_by("id"))
