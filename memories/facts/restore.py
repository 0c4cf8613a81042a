"""Bringing a core fact back as a snapshot recorded it (what undoing a dream needs).

``core_facts_snapshot`` (``memories.facts.facts``) records a scope's facts as plain
values; ``core_fact_restore`` puts one back with the same id, text, category,
confidence, source and observation time, linked to the scope and audited. Restoring a
fact the scope still holds only puts its values back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils.dateparse import parse_datetime

from core.providers.embeddings import Embedder
from memories.facts.models import EndUser, MemoryUpdate, UserVector, Vector
from memories.facts.services import _new_vector, _user_lock, normalize_fact


def core_fact_restore(
    *,
    scope: EndUser,
    fact: dict[str, Any],
    embedding: Sequence[float],
    embedder: Embedder,
    reason: str,
) -> Vector:
    """Put back one snapshot fact (``{"id", "content", "category", "confidence",
    "source_kind", "source_ref", "observed_at"}``) in ``scope``, audited with ``reason``.

    ``embedding`` is the content's vector, computed by the caller before its
    transaction. Idempotent: a fact already there with these values changes nothing.
    """
    values = {
        "content": fact["content"], "normalized": normalize_fact(fact["content"]),
        "category": fact["category"], "confidence": fact["confidence"],
        "source_kind": fact.get("source_kind") or "message",
        "source_ref": fact.get("source_ref") or "",
    }  # fmt: skip
    observed_at = parse_datetime(fact.get("observed_at") or "")
    with transaction.atomic():
        _user_lock(scope)
        vector = Vector.objects.filter(pk=fact["id"], owner_id=scope.owner_id).first()
        if vector is None:
            vector = _new_vector(
                scope.owner_id, fact["content"], embedding, embedder, observed_at, scope=scope,
                id=fact["id"], **{k: v for k, v in values.items() if k not in ("content", "normalized")},
            )  # fmt: skip
        else:
            changed = {k: v for k, v in values.items() if getattr(vector, k) != v}
            if "content" in changed:
                changed.update(embedding=list(embedding), embedding_model=embedder.model,
                               dimensions=len(embedding))  # fmt: skip
            if changed:
                Vector.objects.filter(pk=vector.pk).update(**changed)
        _, linked = UserVector.objects.get_or_create(end_user=scope, vector=vector)
        if linked or vector.content != fact["content"]:
            MemoryUpdate.objects.create(
                end_user=scope, new_vector=vector, new_content=fact["content"],
                action=MemoryUpdate.Action.ADD, reason=reason,
            )  # fmt: skip
    return vector
