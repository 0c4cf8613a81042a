"""The one search of facts: every door searches a scope's facts through ``fact_search``
(``POST /api/v1/users/{id}/memories/search``, ``/api/v1/engine/search``, the injection
of ``/api/v1/engine/injection`` and of the chat proxy, the tools and MCP), so the same
query on the same scope returns the same facts in the same order whichever door asks.

It ranks the scope's facts by cosine similarity (exactly, or through the HNSW index
past ``ENGINE_EXACT_MAX_FACTS``) and by keyword (any query word, BM25 with the scope's
statistics), merges them (``ENGINE_VECTOR_WEIGHT`` x similarity + the rest x keyword
score normalised to the best match) and multiplies by the decay of the fact's age (as
``core.scoring.decay``), all in one statement (``ranking.candidates_statement``); equal
scores: the newer fact first, then the id. When the embedder fails the search is
keyword-only, never an error.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from core.errors import InvalidInput
from core.providers.embeddings import Embedder, get_embedder
from memories.facts.models import Scope
from memories.facts.ranking import FactFilter, Ranking, scope_fact_search
from memories.facts.scopes import ScopePath, global_scope_find, scope_find, scope_parse

logger = logging.getLogger(__name__)


@dataclass
class FactHit:
    """A fact as a search found it: the fact's fields, its cosine ``similarity`` to the
    query (None: keyword-only), its ``keyword_score`` (BM25; None: no query word) and
    its ``score``. ``scope_path``: the scope it was found in."""

    id: uuid.UUID
    content: str
    category: str
    confidence: float
    source_kind: str
    source_ref: str
    metadata: dict[str, Any]
    observed_at: datetime
    created_at: datetime
    updated_at: datetime
    similarity: float | None
    keyword_score: float | None
    score: float
    scope_path: tuple[str, ...] = field(default=(), kw_only=True)

    @property
    def pk(self) -> uuid.UUID:
        return self.id


@dataclass
class SearchResult:
    hits: list[FactHit]
    mode: str  # "hybrid" or "keyword" (the embedder failed or there was no vector)
    embedder_error: str | None = None
    vector_path: str = ""  # "index" (HNSW walk), "exact" (scan of the scope), "" (none)


@dataclass(frozen=True)
class QueryVector:
    """The query as the vector leg takes it: its embedding and model, or (``vector``
    None) the embedder's error: the search is keyword-only."""

    vector: list[float] | None
    model: str | None
    error: str | None = None


def query_embed(
    query: str, embedder: Embedder | None = None, query_vector: Sequence[float] | None = None
) -> QueryVector:
    """Embed ``query`` once (or take ``query_vector``, its embedding) for one or more
    searches; an embedder failure is a keyword-only query, never an error."""
    try:
        embedder = embedder or get_embedder()
        if query_vector is None:
            query_vector = embedder.embed([query])[0]
        return QueryVector([float(x) for x in query_vector], embedder.model)
    except Exception as exc:  # any embedder failure: keyword-only, never an error
        logger.warning("fact search is keyword-only: the embedder failed: %s", exc)
        return QueryVector(None, None, f"{type(exc).__name__}: {exc}")


def fact_filter(value: Mapping[str, Any] | None) -> FactFilter | None:
    """``{"category": "goal" | [...], "min_confidence": 0.8}`` -> FactFilter."""
    if not value:
        return None
    unknown = set(value) - {"category", "min_confidence"}
    if unknown:
        raise InvalidInput(
            "filter takes category and min_confidence",
            details={"filter": f"unknown keys: {', '.join(sorted(unknown))}"},
        )
    category = value.get("category")
    categories = [category] if isinstance(category, str) else category
    return FactFilter(categories=categories, min_confidence=value.get("min_confidence"))


def _pool(limit: int, offset: int) -> int:
    # Decay reorders the best candidates by relevance; 5x what is asked, at least 50.
    return max(5 * (limit + offset), 50)


def fact_search(
    *,
    owner: AbstractBaseUser | int,
    scope: ScopePath | Scope,
    query: str,
    limit: int = 10,
    offset: int = 0,
    filter: FactFilter | None = None,
    half_life_days: float | None = None,
    embedder: Embedder | None = None,
    query_vector: Sequence[float] | QueryVector | None = None,
    include_globals: bool = False,
) -> SearchResult:
    """The scope's facts best matching ``query``: min(limit, matching) of them from
    ``offset``. Hybrid when the query can be embedded (every fact of the embedding model
    matches), keyword-only when the embedder fails (facts sharing a word match).
    ``half_life_days`` (``ENGINE_HALF_LIFE_DAYS`` when None, 0 = none) decays the score
    by the age of the fact (when it was said). A scope path the owner does not have
    finds nothing. ``include_globals``: the owner's global memories, searched the same
    way in their own scope (same query, limit and offset), fill what the scope's hits
    leave of the ``limit``."""
    row = (
        scope
        if isinstance(scope, Scope)
        else scope_find(owner=owner, scope=scope_parse(list(scope)))
    )
    q = (
        query_vector
        if isinstance(query_vector, QueryVector)
        else query_embed(query, embedder, query_vector)
    )
    found = scope_search(row, query, q, limit=limit, offset=offset, filter=filter,
                         half_life_days=half_life_days)  # fmt: skip
    if include_globals and len(found.hits) < limit:
        glob = global_scope_find(owner=owner)
        if glob is not None and (row is None or glob.pk != row.pk):
            more = scope_search(glob, query, q, limit=limit, offset=offset, filter=filter,
                                half_life_days=half_life_days)  # fmt: skip
            found.hits += more.hits[: limit - len(found.hits)]
    return found


def scope_search(
    row: Scope | None,
    query: str,
    q: QueryVector,
    *,
    limit: int,
    offset: int = 0,
    filter: FactFilter | None = None,
    half_life_days: float | None = None,
) -> SearchResult:
    """``fact_search`` of one scope row with the query embedded (``query_embed``)."""
    mode = "keyword" if q.vector is None else "hybrid"
    if row is None:
        return SearchResult([], mode, q.error)
    pool = _pool(limit, offset)
    half_life = settings.ENGINE_HALF_LIFE_DAYS if half_life_days is None else half_life_days
    weight = 0.0 if q.vector is None else min(1.0, settings.ENGINE_VECTOR_WEIGHT)
    # Past ENGINE_EXACT_MAX_FACTS (and the pool), and past ENGINE_WALK_MIN_SHARE of the
    # table or ENGINE_EXACT_CAP_FACTS, the vector leg walks the HNSW index; a short walk
    # (a filter few facts pass, the scan cap) is redone exactly: all in SQL, with the
    # merge and the decay.
    found = scope_fact_search(
        scope_id=row.pk, text=query, vector=q.vector, embedding_model=q.model, pool=pool,
        index_above=max(settings.ENGINE_EXACT_MAX_FACTS, pool), filter=filter,
        walk_share=settings.ENGINE_WALK_MIN_SHARE, exact_cap=settings.ENGINE_EXACT_CAP_FACTS,
        ranking=Ranking(weight, half_life, timezone.now(), limit, offset),
    )  # fmt: skip
    path = tuple(row.path)
    hits = [_hit(hit, path) for hit in found.rows]
    return SearchResult(hits, mode, q.error, found.vector_path)


def _hit(row: tuple[Any, ...], path: tuple[str, ...]) -> FactHit:
    hit = FactHit(*row, scope_path=path)
    if isinstance(hit.metadata, str):  # (Django's connections load jsonb as its text)
        hit.metadata = json.loads(hit.metadata)
    return hit
