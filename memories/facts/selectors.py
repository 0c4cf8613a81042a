"""Reads of facts and scopes, always scoped by owner (and scope). The search of facts
is ``memories.facts.search`` (the retrieval engine's facts collection)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from core import key_limits
from core.errors import InvalidInput, NotFound
from core.key_limits import end_user_check, scope_check, scope_filter
from core.replicas import read_connection
from memories.facts.models import Fact, FactChange, FactLink, FactVersion, Scope
from memories.facts.scopes import ScopePath, owner_pk, scope_find, scope_parse
from memories.facts.search import FactFilter
from memories.facts.timeline import At


class FactNotFound(NotFound):
    code = "fact_not_found"


class ScopeNotFound(NotFound):
    code = "scope_not_found"


# --- Scopes ---------------------------------------------------------------------------


def end_user_find(*, owner: AbstractBaseUser | int, external_id: str) -> Scope | None:
    """The owner's end user ``external_id`` (the scope ``["user", <id>]``), if any: in
    reach of the request's key (core.key_limits)."""
    end_user_check(external_id)
    return Scope.objects.filter(owner_id=owner_pk(owner), external_id=external_id).first()


def end_user_list(*, owner: AbstractBaseUser | int) -> QuerySet[Scope]:
    """The owner's end users (the ``["user", <id>]`` scopes)."""
    return Scope.objects.filter(owner_id=owner_pk(owner), external_id__isnull=False).order_by(
        "external_id"
    )


def scopes_of_owner(*, owner_id: int, limit: int = 100) -> list[list[str]]:
    """The paths of the owner's scopes (not its global memories'), newest first (those
    in reach of the request's key)."""
    return list(
        scope_filter(Scope.objects.filter(owner_id=owner_id))
        .exclude(path=[])
        .order_by("-created_at", "-id")
        .values_list("path", flat=True)[:limit]
    )


def fact_count(*, scope: Scope) -> int:
    """Facts linked to the scope (its row's ``fact_count``, kept by the database)."""
    return scope_fact_count(scope_id=scope.pk)


def scope_fact_count(*, scope_id: int) -> int:
    """Facts linked to the scope: its row's ``fact_count``, kept by the database on every
    link written (migration 0009)."""
    with read_connection().cursor() as cur:
        cur.execute("SELECT fact_count FROM memories_scope WHERE id = %s", [scope_id])
        row = cur.fetchone()
    return int(row[0]) if row else 0


# --- Facts ----------------------------------------------------------------------------


def fact_list(*, scope: Scope, filter: FactFilter | None = None) -> QuerySet[Fact]:
    """The scope's facts, highest confidence first, then the most recently changed."""
    qs = Fact.objects.filter(owner_id=scope.owner_id, links__scope=scope).defer("embedding")
    if filter is not None and filter.categories:
        qs = qs.filter(category__in=filter.categories)
    if filter is not None and filter.min_confidence is not None:
        qs = qs.filter(confidence__gte=filter.min_confidence)
    return qs.order_by("-confidence", "-updated_at", "id")


@dataclass(frozen=True)
class PastFact:
    """A version of a fact as a read in time finds it (``timeline_list``): the fact's
    fields at that version (``id``: the fact's), and its recorded interval
    (``recorded_to`` None: still current)."""

    id: uuid.UUID
    content: str
    category: str
    confidence: float
    source_kind: str
    source_ref: str
    metadata: dict[str, Any]
    observed_at: Any
    created_at: Any
    updated_at: Any
    valid_from: Any
    valid_to: Any
    recorded_from: Any
    recorded_to: Any
    tokens: int | None

    @property
    def pk(self) -> uuid.UUID:
        return self.id


def timeline_list(*, scope: Scope, at: At, filter: FactFilter | None = None) -> list[PastFact]:
    """The scope's facts at ``at`` (``timeline``): the versions believed then (and, with
    ``valid_at``, true then), highest confidence first, then the most recently changed."""
    when, params = at.sql("t.")
    where, filter_params = (filter or FactFilter()).sql("t.")
    sql = (
        "SELECT t.fact_id, t.content, t.category, t.confidence, t.source_kind, t.source_ref,"
        " t.metadata, t.observed_at, t.created_at, t.updated_at, t.valid_from, t.valid_to,"
        " t.recorded_from, t.recorded_to, coalesce(f.tokens, v.tokens)"
        " FROM memories_fact_timeline t LEFT JOIN memories_fact f ON f.id = t.id"
        " LEFT JOIN memories_factversion v ON v.id = t.id"
        " WHERE (t.scope_id = %s OR (t.scope_id IS NULL AND t.id IN (SELECT fact_id FROM"
        f" memories_factlink WHERE scope_id = %s AND shared))) AND {when}{where}"
        " ORDER BY t.confidence DESC, t.updated_at DESC, t.fact_id, t.recorded_from"
    )
    with read_connection().cursor() as cur:
        cur.execute(sql, [scope.pk, scope.pk, *params, *filter_params])
        rows = cur.fetchall()
    return [PastFact(*_json_metadata(row)) for row in rows]


def _json_metadata(row: tuple[Any, ...]) -> tuple[Any, ...]:
    metadata = row[6]
    if isinstance(metadata, str):  # (Django's connections load jsonb as its text)
        metadata = json.loads(metadata)
    return (*row[:6], metadata, *row[7:])


def fact_get(*, scope: Scope, fact_id: uuid.UUID | str) -> Fact:
    """One of the scope's facts; ``FactNotFound`` (404) unless the scope holds it."""
    try:
        return fact_list(scope=scope).get(pk=fact_id)
    except (Fact.DoesNotExist, ValueError, TypeError):
        raise FactNotFound("no such fact") from None


def fact_find(*, owner: AbstractBaseUser | int, fact_id: uuid.UUID | str | None) -> Fact | None:
    """The owner's fact with this id, if there is one (whatever its scope)."""
    if not fact_id:
        return None
    try:
        return Fact.objects.defer("embedding").filter(owner_id=owner_pk(owner), pk=fact_id).first()
    except (ValueError, TypeError):
        return None


def facts_by_id(*, scope: Scope, ids: list[str]) -> dict[str, Fact]:
    """The scope's facts with these ids (one query), by id."""
    return {str(f.pk): f for f in fact_list(scope=scope).filter(pk__in=ids)}


def fact_scopes(*, fact: Fact) -> list[Scope]:
    """The scopes a fact is linked to."""
    return list(Scope.objects.filter(links__fact=fact).order_by("id"))


def fact_resolve(
    *,
    owner: AbstractBaseUser | int,
    fact_id: uuid.UUID | str,
    scope: ScopePath | Scope | None = None,
) -> tuple[Fact, Scope]:
    """The owner's fact and the scope a change applies to: ``scope`` (a path or a row)
    when given, else the one scope linking it. Another owner's fact, one the given
    scope does not hold, or a global memory asked for without its scope, is
    ``FactNotFound`` (404). A fact shared by several scopes needs ``scope``
    (``scope_required``, 400)."""
    try:
        fact = Fact.objects.defer("embedding").get(owner_id=owner_pk(owner), pk=fact_id)
    except (Fact.DoesNotExist, ValueError, TypeError):
        raise FactNotFound("no such fact") from None
    if scope is not None:
        row = scope if isinstance(scope, Scope) else _owned(owner, scope)
        if row is None or not FactLink.objects.filter(scope=row, fact=fact).exists():
            raise FactNotFound("no such fact in this scope")
        scope_check(row.path)
        return fact, row
    scopes = [fact.scope] if fact.scope_id is not None else fact_scopes(fact=fact)
    scopes = [s for s in scopes if s is not None and not s.is_global]
    limits = key_limits.current()
    if limits is not None and len(scopes) > 1:  # (the others are not the key's to name)
        scopes = [s for s in scopes if limits.reaches(s.path)] or scopes[:1]
    if len(scopes) == 1:
        scope_check(scopes[0].path, named=False)
        return fact, scopes[0]
    if not scopes:
        raise FactNotFound("no such fact")
    raise InvalidInput(
        "this fact is shared by several scopes: name the scope",
        code="scope_required",
        details={"scopes": [s.path for s in scopes]},
    )


def _owned(owner: AbstractBaseUser | int, path: ScopePath) -> Scope | None:
    return scope_find(owner=owner, scope=scope_parse(list(path)))


def fact_versions(*, scope: Scope, fact_id: uuid.UUID | str) -> list[FactVersion | Fact]:
    """A fact's versions in the scope, oldest first, its current version (a ``Fact``)
    last when it has one: the closed versions of its lineage (the facts it replaced,
    and those that replaced it, whichever of their ids is asked for)."""
    try:
        ids = {uuid.UUID(str(fact_id))}
    except ValueError:
        return []
    versions: dict[uuid.UUID, FactVersion] = {}
    for _ in range(100):  # a lineage is a chain: a few steps
        found = (
            FactVersion.objects.filter(scope=scope, owner_id=scope.owner_id)
            .filter(Q(fact_id__in=ids) | Q(successor_id__in=ids))
            .defer("embedding")
        )
        grown = {v.pk: v for v in found}
        more = {v.fact_id for v in grown.values()} | {
            v.successor_id for v in grown.values() if v.successor_id is not None
        }
        versions.update(grown)
        if more <= ids:
            break
        ids |= more
    current = list(fact_list(scope=scope).filter(pk__in=ids).order_by("created_at", "id"))
    ordered: list[FactVersion | Fact] = sorted(
        versions.values(), key=lambda v: (v.recorded_to, v.recorded_from, str(v.pk))
    )
    return ordered + current  # type: ignore[operator]


def version_scope(*, owner: AbstractBaseUser | int, fact_id: uuid.UUID | str) -> Scope | None:
    """The scope of the owner's latest closed version of this fact id (a fact no longer
    current: deleted, replaced), if it has one."""
    try:
        version = (
            FactVersion.objects.filter(owner_id=owner_pk(owner), fact_id=fact_id)
            .select_related("scope")
            .order_by("-recorded_to")
            .first()
        )
    except (ValueError, TypeError):
        return None
    if version is not None:
        scope_check(version.scope.path, named=False)
    return version.scope if version is not None else None


def fact_history(
    *, scope: Scope, fact_id: uuid.UUID | str, versions: list[FactVersion | Fact] | None = None
) -> QuerySet[FactChange]:
    """The scope's audit rows that created, replaced, changed or removed the fact, and
    the facts of its lineage (``versions``, as ``fact_versions`` found them: whichever of
    its ids is asked for, the same rows; the newest id gave only its own)."""
    ids = {str(fact_id)}
    for version in versions or ():
        if isinstance(version, FactVersion):
            ids |= {str(version.fact_id)} | (
                {str(version.successor_id)} if version.successor_id else set()
            )
        else:
            ids.add(str(version.pk))
    return (
        FactChange.objects.filter(scope=scope)
        .filter(Q(old_fact_id__in=ids) | Q(new_fact_id__in=ids))
        .order_by("created_at", "id")
    )


@dataclass(frozen=True)
class FactRow:
    """A fact as injection reads it: plain values, and no time (reading hundreds of
    timestamps at once cost more than the rest of an injection). ``tokens``: its
    injection line's, counted when it was written (None: not counted, a row written by
    something other than the write service)."""

    id: uuid.UUID
    content: str
    category: str
    confidence: float
    tokens: int | None

    @property
    def pk(self) -> uuid.UUID:
        return self.id


_ROW_FIELDS = ("id", "content", "category", "confidence", "tokens")


def fact_rows(*, scope: Scope, at: At | None = None) -> list[FactRow]:
    """The scope's facts as ``FactRow``, highest confidence first, then the most
    recently changed (``at``: those of that time, ``timeline_list``)."""
    if at is not None and at.past:
        return [FactRow(f.id, f.content, f.category, f.confidence, f.tokens)
                for f in timeline_list(scope=scope, at=at)]  # fmt: skip
    rows = fact_list(scope=scope).values_list(*_ROW_FIELDS)
    return [FactRow(*row) for row in rows]


def facts_snapshot(*, scope: Scope) -> list[dict[str, Any]]:
    """The scope's facts as plain values (id, content, category, confidence, source,
    times), highest confidence first: what a consolidation reads and can restore."""
    return [
        {
            "id": str(f.pk),
            "content": f.content,
            "category": f.category,
            "confidence": f.confidence,
            "source_kind": f.source_kind,
            "source_ref": f.source_ref,
            "observed_at": f.observed_at.isoformat(),
            "created_at": f.created_at.isoformat(),
            "updated_at": f.updated_at.isoformat(),
        }  # fmt: skip
        for f in fact_list(scope=scope)
    ]


def global_fact_list(*, owner: AbstractBaseUser | int) -> QuerySet[Fact]:
    """The owner's global memories (the facts of its global scope), newest first; a
    key narrowed to a scope does not reach them directly (core.key_limits)."""
    scope_check(())
    return (
        Fact.objects.filter(owner_id=owner_pk(owner), links__scope__owner_id=owner_pk(owner),
                            links__scope__path=[])
        .defer("embedding")
        .order_by("-created_at", "id")
    )  # fmt: skip


# --- /metrics (core.metrics: the gauges this room declares) --------------------------


def links_count() -> int:
    return FactLink.objects.count()


def facts_count() -> int:
    return Fact.objects.count()


def scopes_count() -> int:
    return Scope.objects.count()


def facts_index_pending_count() -> int:
    return Fact.objects.filter(index_pending=True).count()
