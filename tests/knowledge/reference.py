"""The definition of how the retrieval engine fuses its legs, in Python: what the fusing
statement (``knowledge.retrieval.engine._fuse_sql``) is held to.

Given each leg's rows as the engine's leg statements give them, ``ranked`` returns the
page of (id, score) a search should answer: fusion (min-max weights, reciprocal ranks, or
one leg's raw value), context from the best candidates' neighbours, decay, ties.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
SCALED = 60  # the rows of each leg min-max fusion scales over (its best)


def weighted_scores(
    vector: Sequence[tuple[K, float]], keyword: Sequence[tuple[K, float]], vector_weight: float
) -> dict[K, float]:
    """Min-max normalised scores of the two legs, added with their weights: each leg
    scaled over its best ``SCALED`` rows (ties by key), a row below them counting 0."""
    out: dict[K, float] = {}
    for leg, weight in ((vector, vector_weight), (keyword, 1.0 - vector_weight)):
        if not leg:
            continue
        best = sorted(leg, key=lambda row: (-row[1], row[0]))[:SCALED]  # type: ignore[operator]
        high, low = best[0][1], best[-1][1]
        for key, score in leg:
            scaled = max((score - low) / (high - low), 0.0) if high > low else 1.0
            out[key] = out.get(key, 0.0) + weight * scaled
    return out


def max_scores(
    vector: Sequence[tuple[K, float]],
    keyword: Sequence[tuple[K, float]],
    vector_weight: float,
    fill: dict[K, float] | None = None,
) -> dict[K, float]:
    """w x similarity (negative counts as 0) + (1 - w) x BM25 over the best BM25; a
    keyword candidate the vector leg did not hand over counts its similarity in ``fill``
    (none there: 0)."""
    best = max((s for _, s in keyword), default=0.0) or 1.0
    out = {key: vector_weight * max(sim, 0.0) for key, sim in vector}
    for key, score in keyword:
        if key not in out:
            out[key] = vector_weight * max((fill or {}).get(key, 0.0), 0.0)
        out[key] += (1.0 - vector_weight) * score / best
    return out


def rrf_scores(vector: Sequence[tuple[K, float]], keyword: Sequence[tuple[K, float]], k: int):
    out: dict[K, float] = {}
    for leg in (vector, keyword):
        for rank, (key, _) in enumerate(leg, start=1):
            out[key] = out.get(key, 0.0) + 1.0 / (k + rank)
    return out


def with_context(
    scores: dict[K, float],
    around: dict[K, tuple[list[K], list[K]]],
    weight: float,
    allowed: set[K],
) -> dict[K, float]:
    """Each candidate and neighbour: its own score combined with what it borrows,
    ``own + (1 - own) x lent``, ``lent = 1 - prod over distances d of (1 - weight ** d x
    the best score among the donors d steps away)``. ``around``: for the donors (the best candidates), the
    rows before and after them, nearest first; ``allowed``: the neighbours that may
    become hits (inside the search's scope)."""
    best: dict[K, dict[int, float]] = {}
    for key, sides in around.items():
        score = scores.get(key, 0.0)
        for side in sides:
            for distance, other in enumerate(side, start=1):
                if other in scores or other in allowed:
                    at = best.setdefault(other, {})
                    at[distance] = max(at.get(distance, 0.0), score)
    out = dict(scores)
    for key, at in best.items():
        # (the statement's float operations: a product as the exp of a sum of logs)
        lent = 1 - math.exp(sum(math.log(max(1 - weight**d * v, 1e-300)) for d, v in at.items()))
        own = scores.get(key, 0.0)
        out[key] = own + (1 - own) * lent
    return out


DONORS = 20  # the candidates that lend, however long the page


def ranked(
    vector: Sequence[tuple[K, float]] | None,
    keyword: Sequence[tuple[K, float]] | None,
    *,
    limit: int,
    weight: float = 0.4,
    fusion: str = "minmax",
    rrf_k: int | None = None,
    max_distance: float | None = None,
    neighbours: Callable[[K], tuple[list[K], list[K]]] | None = None,
    allowed: set[K] | None = None,
    context_weight: float = 0.6,
    half_life: float | None = None,
    now: datetime | None = None,
    time_of: Callable[[K], datetime] | None = None,
    similarity: dict[K, float] | None = None,
) -> list[tuple[K, float]]:
    """The page (id, score) best first. ``vector``: (id, distance) nearest first;
    ``keyword``: (id, BM25) best first (None: no such leg). Decay applies to each
    candidate's own score, before context (a donor lends its decayed score); under a
    similarity threshold (``max_distance``) only candidates are hits."""
    sims = [(k, 1.0 - d) for k, d in vector or [] if max_distance is None or d <= max_distance]
    words = list(keyword or [])
    if vector is None or keyword is None:
        scores = dict(sims or words)
    elif rrf_k is not None:
        scores = rrf_scores(sims, words, rrf_k)
    elif fusion == "max":
        near = {
            k: sim for k, sim in (similarity or {}).items()
            if max_distance is None or 1.0 - sim <= max_distance
        }  # fmt: skip
        scores = max_scores(sims, words, weight, near)
    else:
        scores = weighted_scores(sims, words, weight)
    ranks = {k: (r, 10**9) for r, (k, _) in enumerate(sims, start=1)}
    for r, (k, _) in enumerate(words, start=1):
        ranks[k] = (ranks.get(k, (10**9, 0))[0], r)
    if half_life:
        assert now is not None and time_of is not None
        for key in scores:
            age = max(0.0, (now - time_of(key)).total_seconds() / 86400)
            scores[key] *= math.pow(0.5, age / half_life)
    if neighbours is not None and vector is not None and keyword is not None:
        donors = sorted(scores, key=lambda k: (-scores[k], k))[:DONORS]
        scores = with_context(
            scores,
            {d: neighbours(d) for d in donors},
            context_weight,
            set() if max_distance is not None else allowed or set(),
        )
    if fusion == "max":  # (ties: by id)
        order = sorted(scores, key=lambda k: (-scores[k], k))
    else:
        order = sorted(scores, key=lambda k: (-scores[k], *ranks.get(k, (10**9, 10**9)), k))
    return [(k, scores[k]) for k in order[:limit]]
