"""Facts written for a test through the one write service, as a client's add stores
them (every text a fact of its own: only the same text is a duplicate)."""

from __future__ import annotations

from typing import Any

from memories.facts.models import Fact, Scope
from memories.facts.services import FactIn, fact_add


def seed(scope: Scope, *contents: str, reason: str = "seeded", **fields: Any) -> list[Fact]:
    decisions = fact_add(
        owner=scope.owner_id, scope=scope, reason=reason, dedup_threshold=1.01,
        facts=[FactIn(content, **fields) for content in contents],
    )  # fmt: skip
    assert [d.action for d in decisions] == ["add"] * len(contents), decisions
    return [Fact.objects.get(pk=d.fact_id) for d in decisions]
