"""``MemoryEngine``: the engine's in-process API, one instance per owner (tenant).

    engine = MemoryEngine(owner=request.user)
    engine.manage(["user", "alice"], "User prefers dark mode", category="preference")
    engine.search(["user", "alice"], "which theme?", limit=5)
    engine.format_for_injection(["user", "alice"], max_tokens=600, query="which theme?")

Scopes may be templates (``["memories", "{user_id}"]``) filled from ``values``; a
missing value is ``ScopeValueMissing`` (400). The core tier is the facts room
(``memories.facts``: its one write service, its one search, its injection): a fact
managed here for ``["user", "alice"]`` is one of alice's personal memories.

``flush`` (debounced updates, daily journal) and ``dream`` (consolidation) are the
background half of the engine (``memories.engine.updates`` and ``.dreams``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from core.errors import InvalidInput
from memories.engine.dreams import DreamOutcome, dream_run
from memories.engine.models import PendingUpdate
from memories.engine.updates import update_record
from memories.facts.injection import Injection, format_for_injection
from memories.facts.models import Fact, Scope
from memories.facts.scopes import ScopePath, owner_pk, scope_fill, scope_find
from memories.facts.search import SearchResult, fact_filter, fact_search
from memories.facts.selectors import ScopeNotFound
from memories.facts.services import (
    FactDecision,
    FactIn,
    fact_add,
    fact_delete,
    fact_update,
    scope_erase,
)
from memories.facts.timeline import At

ACTIONS = ("create", "update", "delete")


@dataclass
class ManageResult:
    action: str  # what happened: add, replace, duplicate, below_threshold, evicted, update, delete
    fact_id: str | None
    decision: FactDecision | None = None
    fact: Fact | None = None


class MemoryEngine:
    def __init__(self, *, owner: AbstractBaseUser | int, values: Mapping[str, Any] | None = None):
        self.owner = owner
        self.values = dict(values or {})

    def scope(self, scope: Sequence[Any]) -> ScopePath:
        """The scope with its template placeholders filled from ``values``."""
        return scope_fill(list(scope), self.values)

    def manage(
        self,
        scope: Sequence[Any],
        content: str | None = None,
        action: str = "create",
        id: uuid.UUID | str | None = None,
        *,
        category: str | None = None,
        confidence: float | None = None,
        reason: str = "",
        source_kind: str = "api",
        source_ref: str = "",
        metadata: dict[str, Any] | None = None,
        validity: Mapping[str, datetime | None] | None = None,
        source: Mapping[str, Any] | None = None,
    ) -> ManageResult:
        """Create, update or delete one core fact of ``scope`` (audited with ``reason``).

        create: ``content`` (+ category, default ``context``; confidence, default 1.0),
        deduplicated and thresholded like every fact; update: ``id`` and any of content,
        category, confidence; delete: ``id``. Another owner's or scope's id is a 404.
        ``validity``: ``valid_from`` / ``valid_to`` (create, update); ``source``: who
        made the change, kept with the version it closes.
        """
        validity = dict(validity or {})
        target = self.scope(scope)
        if action == "create":
            if not content:
                raise InvalidInput("content is required to create a fact",
                                   details={"content": "required"})  # fmt: skip
            [decision] = fact_add(
                owner=self.owner, scope=target, reason=reason or "created through the engine",
                facts=[FactIn(content, category=category or "context",
                              confidence=1.0 if confidence is None else confidence,
                              source_kind=source_kind, source_ref=source_ref,
                              metadata=metadata or {}, valid_from=validity.get("valid_from"),
                              valid_to=validity.get("valid_to"))],
                source=source,
            )  # fmt: skip
            # a duplicate's fact is the one kept (its text may differ: a semantic match)
            kept = Fact.objects.filter(owner_id=owner_pk(self.owner), pk=decision.fact_id).first() if (
                decision.action == "duplicate" and decision.fact_id) else None  # fmt: skip
            return ManageResult(decision.action, decision.fact_id, decision, kept)
        if action not in ACTIONS:
            raise InvalidInput(f"action must be one of {', '.join(ACTIONS)}",
                               details={"action": action})  # fmt: skip
        if id is None:
            raise InvalidInput(f"id is required to {action} a fact", details={"id": "required"})
        if action == "update":
            fact = fact_update(
                owner=self.owner, fact_id=id, scope=target, content=content, category=category,
                confidence=confidence, reason=reason or "edited", source=source,
                validity=validity, refuse_duplicate=True,
            )  # fmt: skip
            return ManageResult("update", str(fact.pk), fact=fact)
        fact_delete(owner=self.owner, fact_id=id, scope=target, reason=reason or "deleted",
                    source=source)  # fmt: skip
        return ManageResult("delete", str(id))

    def add_facts(
        self, scope: Sequence[Any], facts: Sequence[FactIn], *, reason: str, **options: Any
    ) -> list[FactDecision]:
        """A batch of facts (extraction, consolidation): ``fact_add``."""
        return fact_add(
            owner=self.owner, scope=self.scope(scope), facts=facts, reason=reason, **options
        )

    def existing(self, scope: Sequence[Any]) -> Scope:
        """The owner's row of ``scope``; ``ScopeNotFound`` (404) if the owner has none."""
        row = scope_find(owner=self.owner, scope=self.scope(scope))
        if row is None:
            raise ScopeNotFound("no such scope")
        return row

    def _target(self, scope: Sequence[Any], must_exist: bool) -> ScopePath | Scope:
        return self.existing(scope) if must_exist else self.scope(scope)

    def search(
        self,
        scope: Sequence[Any],
        query: str,
        limit: int = 10,
        offset: int = 0,
        filter: Mapping[str, Any] | None = None,
        *,
        half_life_days: float | None = None,
        must_exist: bool = False,
        at: At | None = None,
    ) -> SearchResult:
        """Hybrid keyword + vector search of the scope's facts with decay. A scope the
        owner does not have finds nothing, or is ``ScopeNotFound`` with ``must_exist``
        (what the REST API answers; the agent tools search a scope not written yet).
        ``at``: the facts believed (``as_of``) or true (``valid_at``) then."""
        return fact_search(
            owner=self.owner, scope=self._target(scope, must_exist), query=query, limit=limit,
            offset=offset, filter=fact_filter(filter), half_life_days=half_life_days, at=at,
        )  # fmt: skip

    def format_for_injection(
        self,
        scope: Sequence[Any],
        max_tokens: int,
        query: str | None = None,
        *,
        must_exist: bool = False,
        at: At | None = None,
    ) -> Injection:
        """The scope's facts as a prompt block within ``max_tokens`` (``must_exist``,
        ``at``: as ``search``)."""
        return format_for_injection(
            owner=self.owner, scope=self._target(scope, must_exist), max_tokens=max_tokens,
            query=query, at=at,
        )  # fmt: skip

    def erase(self, scope: Sequence[Any]) -> int:
        """Erase the scope: its facts, their audit trail, the scope itself, and what the
        engine keeps of it (pending updates, dreams, conversation summaries, journal,
        ``MEMORY.md``, diaries; ``memories.engine.erasure``). Returns the facts removed;
        an unknown scope is a 404 (``ScopeNotFound``) and changes nothing."""
        return scope_erase(scope=self.existing(scope))

    # --- The background half (issue 12, second part) ----------------------------------

    def flush(
        self, scope: Sequence[Any], messages: Sequence[Mapping[str, Any]], *, source: str = "engine"
    ) -> PendingUpdate:
        """Queue a debounced update of ``scope`` from ``messages`` (returns at once): one
        extraction per ``MEMORY_UPDATE_DEBOUNCE_SECONDS`` window, and a journal entry."""
        return update_record(
            owner=self.owner, scope=self.scope(scope), messages=list(messages), source=source
        )

    def dream(
        self, scope: Sequence[Any], lookback_days: int | None = None, **options: Any
    ) -> DreamOutcome:
        """Consolidate the scope's core facts with its recent journal (reversible:
        ``memories.engine.dreams.dream_undo``)."""
        return dream_run(
            owner=self.owner, scope=self.scope(scope), lookback_days=lookback_days, **options
        )
