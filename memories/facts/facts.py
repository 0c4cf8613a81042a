"""Core facts: the personal-memory store generalised to scopes (the engine's core tier).

A core fact is a ``Vector`` linked to a scope (``EndUser``), with a category, a
confidence in [0, 1] and its source. Every write of a scope takes the scope's
advisory lock (the one personal memories take) and re-checks duplicates under it, so
concurrent writers of one scope leave one fact per meaning; every change writes a
``MemoryUpdate`` audit row with its reason, evictions included.

In-process API (the engine facade, the REST views and the background pipelines call
these): ``core_fact_add`` (a batch; returns one ``FactDecision`` per input),
``core_fact_update``, ``core_fact_delete``, ``core_fact_resolve`` (a fact id of the
owner -> the fact and its scope).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from core.errors import InvalidInput, NotFound
from core.providers.embeddings import Embedder, get_embedder
from knowledge.models import INDEXED_DIMENSIONS
from memories.facts.models import CATEGORIES, EndUser, MemoryUpdate, UserVector, Vector
from memories.facts.scopes import Scope, scope_ensure, scope_find, scope_parse
from memories.facts.selectors import (
    core_fact_count,
    core_fact_get,
    fact_scopes,
    scope_is_large,
    scope_nearest_indexed,
    scope_vector_ranking,
)
from memories.facts.services import (
    _delete_if_orphan,
    _new_vector,
    _user_lock,
    counter_add,
    memory_delete,
    memory_update,
    normalize_fact,
    validate_content,
)

logger = logging.getLogger("memories.decisions")

SOURCE_KINDS = ("message", "journal", "api", "dream", "import")


class FactNotFound(NotFound):
    code = "fact_not_found"


@dataclass
class FactIn:
    """One fact to add. ``replaces``: the id of a fact of the same scope it contradicts
    or refines (decided by the caller, e.g. the extraction LLM); that fact is unlinked
    and the replacement audited with ``reason``."""

    content: str
    category: str = "context"
    confidence: float = 1.0
    source_kind: str = "api"
    source_ref: str = ""
    observed_at: datetime | None = None
    replaces: uuid.UUID | str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class FactDecision:
    """What ``core_fact_add`` did with one input, in input order.

    ``action``: ``add``, ``replace`` (``target_id`` unlinked), ``duplicate`` (``fact_id``
    is the existing fact; ``match`` is "exact" or "semantic"), ``below_threshold``
    (nothing written), ``evicted`` (added, then trimmed at once by ``max_facts``),
    ``flip_flop`` (a replacement that would bring back a text the same fact replaced
    within the last ``ENGINE_FLIP_FLOP_WINDOW`` replacements of the scope, without a
    higher confidence: nothing written, ``fact_id`` is the fact kept).
    ``evicted_ids`` on the last decision of a batch lists every fact trimmed.
    """

    content: str
    action: str
    reason: str = ""
    fact_id: str | None = None
    target_id: str | None = None
    match: str | None = None
    similarity: float | None = None
    evicted_ids: list[str] = field(default_factory=list)


def validate_fact(fact: FactIn) -> FactIn:
    fact.content = validate_content(fact.content)
    if fact.category not in CATEGORIES:
        raise InvalidInput(
            f"category must be one of {', '.join(CATEGORIES)}",
            details={"category": f"{fact.category!r} is not a category"},
        )
    if not isinstance(fact.confidence, int | float) or not 0 <= fact.confidence <= 1:
        raise InvalidInput(
            "confidence must be a number from 0 to 1", details={"confidence": fact.confidence}
        )
    if fact.source_kind not in SOURCE_KINDS:
        raise InvalidInput(
            f"source_kind must be one of {', '.join(SOURCE_KINDS)}",
            details={"source_kind": fact.source_kind},
        )
    fact.confidence = float(fact.confidence)
    return fact


def _exact_in_scope(scope: EndUser, normalized: str) -> Vector | None:
    # (owner, normalized) index: a handful of rows whatever the scope's size.
    return (
        Vector.objects.filter(owner_id=scope.owner_id, normalized=normalized, links__end_user=scope)
        .defer("embedding")
        .first()
    )


def _nearest_in_scope(
    scope: EndUser, embedding: Sequence[float], model: str
) -> tuple[uuid.UUID, float] | None:
    """The scope's fact nearest to ``embedding``: an exact scan of the scope's index
    range up to ``ENGINE_EXACT_MAX_FACTS`` facts, the HNSW index of the dimension
    beyond (so the check costs the same however large the scope grows)."""
    if len(embedding) in INDEXED_DIMENSIONS and scope_is_large(
        scope_id=scope.pk, above=settings.ENGINE_EXACT_MAX_FACTS
    ):
        found = scope_nearest_indexed(scope_id=scope.pk, vector=embedding, embedding_model=model)
        if found is not None:
            return found
    ranked = scope_vector_ranking(
        scope_id=scope.pk, vector=embedding, embedding_model=model, limit=1
    )
    return ranked[0] if ranked else None


def _evict(scope: EndUser, max_facts: int, reason: str) -> list[str]:
    """Trim the scope to ``max_facts``: lowest confidence first, then oldest (audited).
    Counts the scope's links only when it holds more than ``max_facts``."""
    if not scope_is_large(scope_id=scope.pk, above=max_facts):
        return []
    excess = core_fact_count(scope=scope) - max_facts
    if excess <= 0:
        return []
    victims = list(
        Vector.objects.filter(owner_id=scope.owner_id, links__end_user=scope)
        .defer("embedding")
        .order_by("confidence", "observed_at", "id")[:excess]
    )
    for victim in victims:
        UserVector.objects.filter(end_user=scope, vector=victim).delete()
        MemoryUpdate.objects.create(
            end_user=scope, old_vector=victim, old_content=victim.content,
            action=MemoryUpdate.Action.EVICT,
            reason=f"max_facts {max_facts} reached ({reason})" if reason else
            f"max_facts {max_facts} reached",
        )  # fmt: skip
        _delete_if_orphan(victim)
    counter_add("memory_evictions_total", len(victims))
    return [str(v.pk) for v in victims]


def core_fact_add(
    *,
    owner: AbstractBaseUser | int,
    scope: Scope | EndUser,
    facts: Sequence[FactIn],
    reason: str = "",
    min_confidence: float | None = None,
    max_facts: int | None = None,
    dedup_threshold: float | None = None,
    embedder: Embedder | None = None,
) -> list[FactDecision]:
    """Add a batch of facts to a scope; one ``FactDecision`` per input, in order.

    Facts below ``min_confidence`` (``ENGINE_MIN_CONFIDENCE``, 0.7) are not written.
    A fact whose normalised text, or whose meaning (cosine >= ``dedup_threshold``,
    ``MEMORY_DEDUP_THRESHOLD``), the scope already holds is a duplicate: nothing is
    written. A fact with ``replaces`` supersedes that fact of the scope. Then the scope
    is trimmed to ``max_facts`` (``ENGINE_MAX_FACTS``, 500) by confidence then age.
    Every write is audited with ``reason``. Embeddings are computed before the
    transaction (one call for the batch); a provider failure raises and writes nothing.
    Invalid input raises ``InvalidInput`` before anything is written.
    """
    checked = [validate_fact(f) for f in facts]
    threshold = settings.ENGINE_MIN_CONFIDENCE if min_confidence is None else min_confidence
    limit = settings.ENGINE_MAX_FACTS if max_facts is None else max_facts
    dedup = settings.MEMORY_DEDUP_THRESHOLD if dedup_threshold is None else dedup_threshold
    target = scope if isinstance(scope, EndUser) else scope_ensure(owner=owner, scope=scope)
    decisions: list[FactDecision | None] = [None] * len(checked)
    pending: list[int] = []
    for i, fact in enumerate(checked):
        if fact.confidence < threshold:
            decisions[i] = FactDecision(
                fact.content, "below_threshold", f"confidence {fact.confidence} < {threshold}"
            )
        elif (
            not fact.replaces
            and (found := _exact_in_scope(target, normalize_fact(fact.content))) is not None
        ):  # cheap check first: no embedding needed
            decisions[i] = _duplicate(fact, found, "exact", 1.0)
        else:
            pending.append(i)
    if pending:
        embedder = embedder or get_embedder()
        vectors = embedder.embed([checked[i].content for i in pending])
        embeddings = {i: [float(x) for x in vec] for i, vec in zip(pending, vectors, strict=True)}
        with transaction.atomic():
            _user_lock(target)
            for i in pending:
                decisions[i] = _add_one(target, checked[i], embeddings[i], embedder, dedup, reason)
            evicted = _evict(target, limit, reason)
        _mark_evicted(decisions, evicted)
    out = [d for d in decisions if d is not None]
    _count(out)
    return out


def _duplicate(fact: FactIn, found: Vector, match: str, similarity: float) -> FactDecision:
    return FactDecision(
        fact.content, "duplicate", f"{match} duplicate", fact_id=str(found.pk), match=match,
        similarity=similarity,
    )  # fmt: skip


def _add_one(
    scope: EndUser,
    fact: FactIn,
    embedding: list[float],
    embedder: Embedder,
    dedup: float,
    reason: str,
) -> FactDecision:
    old: Vector | None = None
    if fact.replaces:
        old = (
            Vector.objects.filter(pk=fact.replaces, links__end_user=scope, owner_id=scope.owner_id)
            .defer("embedding")
            .first()
        )
        if old is None:
            reason = f"{reason}; the fact to replace is gone, kept as new".lstrip("; ")
    if old is not None and (undone := _flip_flop(scope, old, fact)) is not None:
        return FactDecision(
            fact.content,
            "flip_flop",
            f"would restore the text replaced by {undone.created_at:%Y-%m-%d %H:%M} "
            f"({undone.reason or 'no reason'}) without a higher confidence "
            f"({fact.confidence} <= {old.confidence}): kept the newer fact",
            fact_id=str(old.pk),
            target_id=str(old.pk),
        )
    if old is None:
        found = _exact_in_scope(scope, normalize_fact(fact.content))
        if found is not None:  # re-checked under the lock
            return _duplicate(fact, found, "exact", 1.0)
        nearest = _nearest_in_scope(scope, embedding, embedder.model)
        if nearest is not None and nearest[1] >= dedup:
            return _duplicate(fact, Vector(pk=nearest[0]), "semantic", nearest[1])
    vector = _new_vector(
        scope.owner_id, fact.content, embedding, embedder, fact.observed_at,
        metadata=fact.metadata, scope=scope, category=fact.category,
        confidence=fact.confidence, source_kind=fact.source_kind, source_ref=fact.source_ref,
    )  # fmt: skip
    UserVector.objects.create(end_user=scope, vector=vector)
    if old is not None:
        UserVector.objects.filter(end_user=scope, vector=old).delete()
        MemoryUpdate.objects.create(
            end_user=scope, old_vector=old, new_vector=vector, old_content=old.content,
            new_content=fact.content, action=MemoryUpdate.Action.REPLACE, reason=reason,
        )  # fmt: skip
        _delete_if_orphan(old)
        return FactDecision(
            fact.content, "replace", reason, fact_id=str(vector.pk), target_id=str(old.pk)
        )
    MemoryUpdate.objects.create(
        end_user=scope, new_vector=vector, new_content=fact.content,
        action=MemoryUpdate.Action.ADD, reason=reason,
    )  # fmt: skip
    return FactDecision(fact.content, "add", reason, fact_id=str(vector.pk))


def _flip_flop(scope: EndUser, old: Vector, fact: FactIn) -> MemoryUpdate | None:
    """The flip-flop guard of replacements (A -> B -> A from noisy extraction).

    Replacing ``old`` (B) with ``fact`` (A) is refused when one of the scope's last
    ``ENGINE_FLIP_FLOP_WINDOW`` replacements (an extraction or a dream each makes a
    few) made B out of the same text A, unless A now comes with a strictly higher
    confidence than B has: the newer fact is kept, and a user who really changed their
    mind back says it with conviction (a stated correction scores higher than the
    noise). Returns that earlier replacement when the guard holds."""
    window = settings.ENGINE_FLIP_FLOP_WINDOW
    if window <= 0 or fact.confidence > old.confidence:
        return None
    wanted = normalize_fact(fact.content)
    recent = MemoryUpdate.objects.filter(
        end_user=scope, action=MemoryUpdate.Action.REPLACE
    ).order_by("-created_at", "-id")[:window]
    for update in recent:
        if update.new_vector_id == old.pk and normalize_fact(update.old_content) == wanted:
            return update
    return None


def _mark_evicted(decisions: list[FactDecision | None], evicted: list[str]) -> None:
    if not evicted:
        return
    gone = set(evicted)
    last = None
    for decision in decisions:
        if decision is None:
            continue
        last = decision
        if decision.action in ("add", "replace") and decision.fact_id in gone:
            decision.action, decision.reason = "evicted", "added, then trimmed by max_facts"
    if last is not None:
        last.evicted_ids = evicted


def _count(decisions: list[FactDecision]) -> None:
    by_action: dict[str, int] = {}
    for decision in decisions:
        by_action[decision.action] = by_action.get(decision.action, 0) + 1
    counter_add("memory_additions_total", by_action.get("add", 0))
    counter_add("memory_replacements_total", by_action.get("replace", 0))
    counter_add("memory_dedup_total", by_action.get("duplicate", 0))
    counter_add("memory_flipflop_total", by_action.get("flip_flop", 0))


def core_fact_resolve(
    *, owner: AbstractBaseUser | int, fact_id: uuid.UUID | str, scope: Scope | None = None
) -> tuple[Vector, EndUser]:
    """The owner's fact and the scope a change applies to. Another owner's fact, or a
    fact not linked to the given scope, is ``FactNotFound`` (404). A fact shared by
    several scopes needs ``scope``."""
    try:
        fact = core_fact_get(owner=owner, fact_id=fact_id)
    except (Vector.DoesNotExist, ValueError, TypeError):
        raise FactNotFound("no such fact") from None
    if scope is not None:
        row = scope_find(owner=owner, scope=scope_parse(list(scope)))
        if row is None or not UserVector.objects.filter(end_user=row, vector=fact).exists():
            raise FactNotFound("no such fact in this scope")
        return fact, row
    if fact.scope_id is not None:
        return fact, EndUser.objects.get(pk=fact.scope_id)
    scopes = fact_scopes(fact=fact)
    if len(scopes) == 1:
        return fact, scopes[0]
    if not scopes:
        raise FactNotFound("no such fact")
    raise InvalidInput(
        "this fact is shared by several scopes: name the scope",
        code="scope_required",
        details={"scopes": [s.scope for s in scopes]},
    )


def core_fact_update(
    *,
    owner: AbstractBaseUser | int,
    fact_id: uuid.UUID | str,
    scope: Scope | None = None,
    content: str | None = None,
    category: str | None = None,
    confidence: float | None = None,
    reason: str = "edited",
) -> Vector:
    """Change a fact's text (re-embedded), category or confidence, audited with
    ``reason``. A fact shared with other scopes is copied for this one (copy on write)."""
    if category is not None and category not in CATEGORIES:
        raise InvalidInput(f"category must be one of {', '.join(CATEGORIES)}",
                           details={"category": category})  # fmt: skip
    if confidence is not None and not 0 <= confidence <= 1:
        raise InvalidInput("confidence must be from 0 to 1", details={"confidence": confidence})
    fact, row = core_fact_resolve(owner=owner, fact_id=fact_id, scope=scope)
    return memory_update(
        end_user=row, vector=fact, content=content, category=category, confidence=confidence,
        reason=reason,
    )  # fmt: skip


def core_fact_delete(
    *,
    owner: AbstractBaseUser | int,
    fact_id: uuid.UUID | str,
    scope: Scope | None = None,
    reason: str = "deleted",
) -> None:
    """Unlink a fact from its scope (audited); the fact goes when no scope links it."""
    fact, row = core_fact_resolve(owner=owner, fact_id=fact_id, scope=scope)
    memory_delete(end_user=row, vector=fact, reason=reason)


def core_facts_snapshot(*, scope: EndUser) -> list[dict[str, Any]]:
    """The scope's facts as plain values (id, content, category, confidence, source,
    times), highest confidence first: what a consolidation reads and can restore."""
    rows = (
        Vector.objects.filter(owner_id=scope.owner_id, links__end_user=scope)
        .defer("embedding")
        .order_by("-confidence", "-updated_at", "id")
    )
    return [
        {
            "id": str(v.pk),
            "content": v.content,
            "category": v.category,
            "confidence": v.confidence,
            "source_kind": v.source_kind,
            "source_ref": v.source_ref,
            "observed_at": v.observed_at.isoformat(),
            "created_at": v.created_at.isoformat(),
            "updated_at": v.updated_at.isoformat(),
        }  # fmt: skip
        for v in rows
    ]
