"""A scope's facts as a prompt block within a token budget: what ``/api/v1/engine/injection``
answers and what the chat proxy puts in the system prompt.

The facts relevant to the query are among those the one search (``search.fact_search``,
the same statement and ranking every door uses) finds: the few nearest the best of them
by relevance (``relevant_hits``: mostly meaning), most relevant first, when the best has
a similarity of at least ``MEMORY_SCORE_THRESHOLD`` or a query word. Each fact's line costs the tokens the write service
counted when it wrote the fact (``Fact.tokens``), not a count on every call.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from core.providers.embeddings import Embedder
from core.providers.tokens import count_tokens
from memories.facts.models import Scope
from memories.facts.scopes import ScopePath, global_scope_find, scope_find, scope_parse
from memories.facts.search import FactHit, QueryVector, query_embed, scope_search
from memories.facts.selectors import FactRow, fact_rows, scope_fact_count
from memories.facts.services import fact_line
from memories.facts.timeline import At

MIN_LINE_TOKENS = 8  # "- [goal | 0.90] x" is 10 tokens: below this nothing fits


@dataclass
class Injection:
    """The block (``text``, its ``tokens``), the facts in it in block order (``facts``;
    then ``globals``, the owner's global memories added for a scope with few facts),
    and the search hits of the relevant ones by id (``relevant``)."""

    text: str
    tokens: int
    facts: list[FactRow] = field(default_factory=list)
    relevant: dict[uuid.UUID, FactHit] = field(default_factory=dict)
    globals: list[FactHit] = field(default_factory=list)


def _line_tokens(fact: FactRow) -> int:
    return fact.tokens if fact.tokens is not None else count_tokens(fact_line(fact))


def _fill(
    candidates: Sequence[FactRow], budget: int, taken: set[uuid.UUID]
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
        cost = _line_tokens(fact) + (1 if taken else 0)
        if used + cost > budget:
            continue
        kept.append(fact)
        taken.add(fact.pk)
        used += cost
    return kept, used


def _most_lines(facts: Sequence[FactRow], budget: int) -> int:
    """How many of ``facts`` a block of ``budget`` tokens can hold at most: as many of
    the shortest lines as fit (each but the first with its newline)."""
    used = count = 0
    for cost in sorted(_line_tokens(f) for f in facts):
        used += cost + (1 if count else 0)
        if used > budget:
            break
        count += 1
    return max(1, count)


# Which hits are relevant to the query (issue 25; tuned on the "tune" half of
# bench/data/personal_facts_dev.json, checked on the other: BENCHMARKS.md). A hit's
# relevance is RELEVANCE_VECTOR_WEIGHT x its similarity (negative counts as 0) + the rest x
# its BM25 score over the best hit's: first-person questions about third-person facts
# ("What's my dog called?" / "Has a golden retriever named Biscuit") are found by meaning
# more than by their words. The relevant ones: those within RELEVANCE_GAP of the best hit
# that passes the floor (a query word, or a similarity at the threshold), RELEVANCE_MAX of
# them at most, most relevant first; none when no hit passes the floor.
RELEVANCE_VECTOR_WEIGHT = 0.85
RELEVANCE_GAP = 0.13
RELEVANCE_MAX = 4


def matching_hits(hits: Sequence[FactHit], threshold: float | None = None) -> list[FactHit]:
    """The hits with a query word or a similarity of at least ``threshold``
    (``MEMORY_SCORE_THRESHOLD``), in search order."""
    floor = settings.MEMORY_SCORE_THRESHOLD if threshold is None else threshold
    return [
        h for h in hits if h.keyword_score or (h.similarity is not None and h.similarity >= floor)
    ]


def relevant_hits(hits: Sequence[FactHit], threshold: float | None = None) -> list[FactHit]:
    """The hits relevant to their query, most relevant first (see ``RELEVANCE_GAP``); the
    floor: a query word or a similarity of at least ``threshold``
    (``MEMORY_SCORE_THRESHOLD``)."""
    best = max((h.keyword_score or 0.0 for h in hits), default=0.0) or 1.0
    weight = RELEVANCE_VECTOR_WEIGHT

    def relevance(hit: FactHit) -> float:
        similarity = max(hit.similarity or 0.0, 0.0)
        return weight * similarity + (1 - weight) * (hit.keyword_score or 0.0) / best

    ranked = sorted(hits, key=lambda h: -relevance(h))  # (stable: the search's order on ties)
    lead = next(iter(matching_hits(ranked, threshold)), None)
    if lead is None:
        return []
    cut = relevance(lead) - RELEVANCE_GAP
    return [h for h in ranked[:RELEVANCE_MAX] if relevance(h) >= cut]


def format_for_injection(
    *,
    owner: AbstractBaseUser | int,
    scope: ScopePath | Scope,
    max_tokens: int,
    query: str | None = None,
    header: str = "",
    relevance_threshold: float | None = None,
    embedder: Embedder | None = None,
    query_vector: Sequence[float] | None = None,
    with_globals: bool = False,
    at: At | None = None,
) -> Injection:
    """The scope's facts as ``- [category | confidence] content`` lines within
    ``max_tokens`` (tiktoken, offline; ``header`` and newlines included).

    Corrections come first, within their own share of the budget
    (``ENGINE_CORRECTION_SHARE``; always included while they fit in it, highest
    confidence first). The rest of the budget (plus what corrections left unused)
    goes to the other facts: with ``query``, the few the one search finds relevant
    (``relevant_hits``) among its first hits (as many as the block can hold lines,
    ``_most_lines``), first, most relevant first; then its other hits with a query word
    or a similarity at the threshold (``matching_hits``), in its order; then the others
    by confidence, then the most recently changed.
    ``with_globals`` (the chat proxy): for a scope with fewer than
    ``MEMORY_GLOBAL_MIN_PERSONAL`` facts, the owner's global memories relevant to the
    query follow as ``- [global] content`` lines while they fit. ``at``: the facts of
    that time (``timeline``), not the current ones.
    """
    row = (
        scope
        if isinstance(scope, Scope)
        else scope_find(owner=owner, scope=scope_parse(list(scope)))
    )
    header_cost = count_tokens(header) + 1 if header else 0
    budget = max_tokens - header_cost
    if budget <= 0:
        return Injection("", 0)
    facts = fact_rows(scope=row, at=at) if row is not None else []
    corrections = [f for f in facts if f.category == "correction"]
    others = [f for f in facts if f.category != "correction"]
    relevant: dict[uuid.UUID, FactHit] = {}
    matching: list[uuid.UUID] = []
    q: QueryVector | None = None
    if query and query.strip() and (others or with_globals):
        q = query_embed(query, embedder, query_vector)
    if q is not None and others and query:
        # The search every door makes (its defaults and order), as far as a block can go.
        found = scope_search(row, query, q, limit=_most_lines(others, budget), at=at)
        wanted = {f.pk for f in others}
        relevant = {
            h.id: h for h in relevant_hits(found.hits, relevance_threshold) if h.id in wanted
        }
        matching = [h.id for h in matching_hits(found.hits, relevance_threshold) if h.id in wanted]
    by_id = {f.pk: f for f in others}
    ordered = [by_id[i] for i in [*relevant, *matching]] + others
    taken: set[uuid.UUID] = set()
    share = int(budget * min(1.0, settings.ENGINE_CORRECTION_SHARE))
    kept_corrections, used = _fill(corrections, share, taken)
    kept_others, used_others = _fill(ordered, budget - used, taken)
    kept = kept_corrections + kept_others
    lines = ([header] if header else []) + [fact_line(f) for f in kept]
    globals_: list[FactHit] = []
    if (
        with_globals
        and q is not None
        and query
        and len(facts) < settings.MEMORY_GLOBAL_MIN_PERSONAL
    ):
        globals_ = _globals(owner, row, query, q, relevance_threshold, at)
    return _block(lines, kept, globals_, max_tokens, header, relevant)


def _globals(owner: AbstractBaseUser | int, row: Scope | None, query: str, q: QueryVector,
             threshold: float | None, at: At | None) -> list[FactHit]:  # fmt: skip
    glob = global_scope_find(owner=owner)
    if glob is None or (row is not None and glob.pk == row.pk):
        return []
    found = scope_search(glob, query, q, limit=max(1, scope_fact_count(scope_id=glob.pk)),
                         at=at)  # fmt: skip
    return matching_hits(found.hits, threshold)  # (every match: a fallback for new users)


def _block(lines: list[str], kept: list[FactRow], globals_: list[FactHit], max_tokens: int,
           header: str, relevant: dict[uuid.UUID, FactHit]) -> Injection:  # fmt: skip
    text = "\n".join(lines) if kept else ""
    while kept and count_tokens(text) > max_tokens:  # BPE merges across lines, rarely
        kept.pop()
        lines.pop()
        text = "\n".join(lines) if kept else ""
    added: list[FactHit] = []
    if globals_:
        lines = lines if kept else [header] if header else []
        for hit in globals_:
            candidate = [*lines, f"- [global] {hit.content}"]
            if count_tokens("\n".join(candidate)) > max_tokens:
                break
            lines = candidate
            added.append(hit)
        if added:
            text = "\n".join(lines)
    tokens = count_tokens(text) if text else 0
    shown = {f.pk for f in kept}
    return Injection(text, tokens, kept, {k: v for k, v in relevant.items() if k in shown}, added)


def injection_payload(injection: Injection) -> dict[str, Any]:
    return {
        "text": injection.text,
        "tokens": injection.tokens,
        "facts": [str(f.pk) for f in injection.facts] + [str(h.id) for h in injection.globals],
    }
