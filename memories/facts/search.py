"""Reads of a scope's core facts: hybrid search with decay, and the injection block.

Search ranks the scope's facts by cosine similarity (exactly, or through the HNSW
index past ``ENGINE_EXACT_MAX_FACTS``) and by keyword (any query word, BM25 with the
scope's statistics: ``selectors._keyword_ctes``), merges them (``ENGINE_VECTOR_WEIGHT``
x similarity + the rest x keyword score normalised to the best match) and multiplies
by the decay of the fact's age (as ``core.scoring.decay``), all in one statement
(``selectors.candidates_statement``); equal scores: the newer fact first, then the id.
When the embedder fails the search is keyword-only, never an error.
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
from django.utils import timezone

from core.providers.embeddings import Embedder, get_embedder
from core.providers.tokens import count_tokens
from memories.facts.models import CATEGORIES, EndUser, Vector
from memories.facts.scopes import Scope, scope_find, scope_parse
from memories.facts.selectors import (
    FactFilter,
    FactRow,
    Ranking,
    core_fact_rows,
    scope_fact_search,
)

logger = logging.getLogger(__name__)


@dataclass
class FactHit:
    id: uuid.UUID
    content: str
    category: str
    confidence: float
    source_kind: str
    source_ref: str
    observed_at: datetime
    created_at: datetime
    updated_at: datetime
    similarity: float | None
    keyword_score: float | None
    score: float


@dataclass
class SearchResult:
    hits: list[FactHit]
    mode: str  # "hybrid" or "keyword" (the embedder failed or there was no vector)
    embedder_error: str | None = None
    vector_path: str = ""  # "index" (HNSW walk), "exact" (scan of the scope), "" (none)


def _pool(limit: int, offset: int) -> int:
    # Decay reorders the best candidates by relevance; 5x what is asked, at least 50.
    return max(5 * (limit + offset), 50)


def core_fact_search(
    *,
    owner: AbstractBaseUser | int,
    scope: Scope | EndUser,
    query: str,
    limit: int = 10,
    offset: int = 0,
    filter: FactFilter | None = None,
    half_life_days: float | None = None,
    embedder: Embedder | None = None,
    query_vector: Sequence[float] | None = None,
) -> SearchResult:
    """The scope's facts best matching ``query``: min(limit, matching) of them from
    ``offset``. Hybrid when the query can be embedded (every fact of the embedding model
    matches), keyword-only when the embedder fails (facts sharing a word match).
    ``half_life_days`` (``ENGINE_HALF_LIFE_DAYS`` when None, 0 = none) decays the score
    by the age of the fact (when it was said)."""
    row = (
        scope
        if isinstance(scope, EndUser)
        else scope_find(owner=owner, scope=scope_parse(list(scope)))
    )
    if row is None:
        return SearchResult([], "hybrid")
    pool = _pool(limit, offset)
    vector, model, error = _embed_query(query, embedder, query_vector)
    half_life = settings.ENGINE_HALF_LIFE_DAYS if half_life_days is None else half_life_days
    weight = 0.0 if vector is None else min(1.0, settings.ENGINE_VECTOR_WEIGHT)
    # Past ENGINE_EXACT_MAX_FACTS (and the pool), and past ENGINE_WALK_MIN_SHARE of the
    # table or ENGINE_EXACT_CAP_FACTS, the vector leg walks the HNSW index; a short walk (a filter few facts pass, the scan cap) is redone exactly: all in SQL,
    # with the merge and the decay.
    found = scope_fact_search(
        scope_id=row.pk, text=query, vector=vector, embedding_model=model, pool=pool,
        index_above=max(settings.ENGINE_EXACT_MAX_FACTS, pool), filter=filter,
        walk_share=settings.ENGINE_WALK_MIN_SHARE, exact_cap=settings.ENGINE_EXACT_CAP_FACTS,
        ranking=Ranking(weight, half_life, timezone.now(), limit, offset),
    )  # fmt: skip
    return SearchResult(
        [FactHit(*row) for row in found.rows],
        "keyword" if vector is None else "hybrid",
        error,
        found.vector_path,
    )


def _embed_query(
    query: str, embedder: Embedder | None, query_vector: Sequence[float] | None
) -> tuple[list[float] | None, str | None, str | None]:
    try:
        embedder = embedder or get_embedder()
        if query_vector is None:
            query_vector = embedder.embed([query])[0]
        return [float(x) for x in query_vector], embedder.model, None
    except Exception as exc:  # any embedder failure: keyword-only, never an error
        logger.warning("engine search is keyword-only: the embedder failed: %s", exc)
        return None, None, f"{type(exc).__name__}: {exc}"


# --- Injection -----------------------------------------------------------------------


@dataclass
class Injection:
    text: str
    tokens: int
    facts: list[FactRow] = field(default_factory=list)
    relevant_ids: set[uuid.UUID] = field(default_factory=set)
    similarity: dict[uuid.UUID, float] = field(default_factory=dict)


def fact_line(fact: FactRow | Vector) -> str:
    return f"- [{fact.category} | {fact.confidence:.2f}] {fact.content}"


MIN_LINE_TOKENS = 8  # "- [goal | 0.90] x" is 10 tokens: below this nothing fits


def _fill(
    candidates: list[FactRow], budget: int, taken: set[uuid.UUID]
) -> tuple[list[FactRow], int]:
    """Lines that fit ``budget`` tokens, in order (one that does not fit is skipped,
    a shorter one after it may still fit). A line costs its tokens and the newline
    before it unless it is the first of the block."""
    kept, used = [], 0
    for fact in candidates:
        if budget - used < MIN_LINE_TOKENS:
            break
        if fact.pk in taken:
            continue
        cost = count_tokens(fact_line(fact)) + (1 if taken else 0)
        if used + cost > budget:
            continue
        kept.append(fact)
        taken.add(fact.pk)
        used += cost
    return kept, used


def format_for_injection(
    *,
    owner: AbstractBaseUser | int,
    scope: Scope | EndUser,
    max_tokens: int,
    query: str | None = None,
    header: str = "",
    relevance_threshold: float | None = None,
    embedder: Embedder | None = None,
    query_vector: Sequence[float] | None = None,
    ranked: Sequence[tuple[uuid.UUID, float]] | None = None,
) -> Injection:
    """The scope's core facts as ``- [category | confidence] content`` lines within
    ``max_tokens`` (tiktoken, offline; ``header`` and newlines included).

    Corrections come first, within their own share of the budget
    (``ENGINE_CORRECTION_SHARE``; always included while they fit in it, highest
    confidence first). The rest of the budget (plus what corrections left unused)
    goes to the other facts: with ``query``, the facts relevant to it first (search
    order, similarity >= ``relevance_threshold`` or a keyword match), then the others
    by confidence, then newest. ``ranked`` ([(fact id, similarity)], best first), when
    given, is the caller's own choice of relevant facts (the chat proxy's hybrid
    ranking) and replaces that search.
    """
    row = (
        scope
        if isinstance(scope, EndUser)
        else scope_find(owner=owner, scope=scope_parse(list(scope)))
    )
    header_cost = count_tokens(header) + 1 if header else 0
    budget = max_tokens - header_cost
    if row is None or budget <= 0:
        return Injection("", 0)
    # (the header's newline is counted above; the first fact line then pays none)
    facts = core_fact_rows(scope=row)
    corrections = [f for f in facts if f.category == "correction"]
    others = [f for f in facts if f.category != "correction"]
    relevant: list[uuid.UUID] = []
    similarity: dict[uuid.UUID, float] = {}
    if ranked is not None:
        relevant = [pk for pk, _ in ranked]
        similarity = dict(ranked)
    elif query and query.strip() and others:
        found = core_fact_search(
            owner=owner, scope=row, query=query, limit=len(others), half_life_days=0,
            embedder=embedder, query_vector=query_vector,
            filter=FactFilter(categories=[c for c in CATEGORIES if c != "correction"]),
        )  # fmt: skip
        threshold = (
            settings.MEMORY_SCORE_THRESHOLD if relevance_threshold is None else relevance_threshold
        )
        for hit in found.hits:
            if hit.keyword_score or (hit.similarity is not None and hit.similarity >= threshold):
                relevant.append(hit.id)
                if hit.similarity is not None:
                    similarity[hit.id] = hit.similarity
    by_id = {f.pk: f for f in others}
    ordered = [by_id[i] for i in relevant if i in by_id] + others
    taken: set[uuid.UUID] = set()
    share = int(budget * min(1.0, settings.ENGINE_CORRECTION_SHARE))
    kept_corrections, used = _fill(corrections, share, taken)
    kept_others, _ = _fill(ordered, budget - used, taken)
    kept = kept_corrections + kept_others
    lines = ([header] if header else []) + [fact_line(f) for f in kept]
    text = "\n".join(lines) if kept else ""
    while kept and count_tokens(text) > max_tokens:  # BPE merges across lines, rarely
        kept.pop()
        lines.pop()
        text = "\n".join(lines) if kept else ""
    return Injection(
        text, count_tokens(text) if text else 0, kept, set(relevant) & {f.pk for f in kept},
        similarity,
    )  # fmt: skip


def injection_payload(injection: Injection) -> dict[str, Any]:
    return {
        "text": injection.text,
        "tokens": injection.tokens,
        "facts": [str(f.pk) for f in injection.facts],
    }
