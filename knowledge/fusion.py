"""How a hybrid search turns its two rankings into one: fusion, then context.

Fusion (SEARCH_FUSION): ``weighted`` (the default) scales each leg's scores to [0, 1]
over its candidates (min-max: the leg's best candidate 1, its worst 0) and adds them
with weights SEARCH_VECTOR_WEIGHT and 1 - that; a chunk missing from a leg gets 0 from
it. Unlike reciprocal-rank fusion it keeps how far apart the scores are: a chunk with a
BM25 score far above the rest (a rare name, an exact phrase) stays far ahead, where RRF
would give it the same lead as any first rank. ``rrf`` sums 1 / (k + rank) per leg, and
is what a request naming ``rrf_k`` gets.

Context (SEARCH_CONTEXT_WEIGHT w, SEARCH_CONTEXT_WINDOW n): a chunk also earns, for each
distance d up to n, w ** d times the best fused score among the chunks d steps before or
after it in the same base and session (ordered by source timestamp, then id: conversation
order for messages, chunk order for a document). Only the best top_k candidates pass
their score on (measured on LoCoMo: better than letting 2 x top_k or all of them do it,
and each costs two index probes), and their neighbours become candidates themselves. In a
conversation the words of a question are often in one turn and the answer in the next
("What pets do you have?" / "Two cats, Luna and Oliver"); a short reply ("Yes, for
running!") is found through the turn it answers.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

Ranking = Sequence[tuple[int, float]]  # (chunk id, score), best first
K = TypeVar("K", bound=Hashable)  # a chunk id, or a personal memory's uuid
CONTEXT_DONORS = 1


def weighted_scores(
    vector: Sequence[tuple[K, float]], keyword: Sequence[tuple[K, float]], vector_weight: float
) -> dict[K, float]:
    """Min-max normalised scores of the two legs, added with their weights."""
    out: dict[K, float] = {}
    for leg, weight in ((vector, vector_weight), (keyword, 1.0 - vector_weight)):
        if not leg:
            continue
        high, low = max(s for _, s in leg), min(s for _, s in leg)
        for chunk_id, score in leg:
            scaled = (score - low) / (high - low) if high > low else 1.0
            out[chunk_id] = out.get(chunk_id, 0.0) + weight * scaled
    return out


def rrf_scores(vector: Ranking, keyword: Ranking, k: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for leg in (vector, keyword):
        for rank, (chunk_id, _) in enumerate(leg, start=1):
            out[chunk_id] = out.get(chunk_id, 0.0) + 1.0 / (k + rank)
    return out


def with_context(
    scores: dict[int, float],
    around: dict[int, tuple[list[int], list[int]]],
    weight: float,
    allowed: set[int],
) -> dict[int, float]:
    """Each candidate and neighbour: its own score + sum over distances d of
    ``weight`` ** d x the best score among the chunks d steps away.

    Searches compute this in SQL, in the statement that reads the top k
    (``search._CONTEXT_SQL``); this is its definition, which the tests hold it to.

    ``around``: for the candidates that pass their score on (the best ones), the
    chunks before and after them, nearest first; what a chunk earns is read off these. ``allowed``: the
    neighbours that may become hits (inside the search's scope).
    """
    best: dict[int, dict[int, float]] = {}  # chunk -> distance -> best candidate score
    for chunk_id, sides in around.items():
        score = scores.get(chunk_id, 0.0)
        for side in sides:
            for distance, other in enumerate(side, start=1):
                if other in scores or other in allowed:
                    at = best.setdefault(other, {})
                    at[distance] = max(at.get(distance, 0.0), score)
    out = dict(scores)
    for chunk_id, at in best.items():
        out[chunk_id] = scores.get(chunk_id, 0.0) + sum(
            weight**distance * value for distance, value in at.items()
        )
    return out
