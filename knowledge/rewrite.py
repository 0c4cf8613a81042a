"""Query rewriting, opt-in: the chat LLM writes other queries for a search, and the
searches of all of them are fused.

A question is often worded unlike the passage that answers it ("Where did she go on
holiday?" / "We spent two weeks in Crete"). With an LLM configured, a search that asks
for it (``"rewrite": true``) first asks the model (``LLM_MODEL``) for up to
``REWRITE_QUERIES`` other queries (a paraphrase, the key names and terms, words the
answer would hold) as a JSON object, repaired or asked again once when it cannot be read
(``core.providers.json_answer``, which reads the variants models write: fences, prose,
other list keys, a bare list). Each query is then searched as the request says (same
mode, filters, top_k), and the rankings are fused: a chunk scores the sum over the
queries of the query's weight x its score there divided by that query's best score; the
original query weighs 1, each rewritten one ``REWRITE_WEIGHT``. So what the question
itself finds keeps its lead unless the rewrites agree on something else.

Never the default, and never in the way: without ``LLM_BASE_URL`` a search asking for
it is refused (503 naming the variable, before anything runs); an LLM that fails, times
out (``SEARCH_REWRITE_TIMEOUT``) or answers nothing usable leaves the search as asked,
and the answer says why (``RewrittenSearch.error``).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings

from core.providers.json_answer import ListSpec, Shape, complete_answer
from core.providers.llm import ChatLLM, get_llm
from core.usage import usage_for
from knowledge.models import KnowledgeBase
from knowledge.search import Hit, SearchError, SearchRequest, search_chunks

logger = logging.getLogger(__name__)
FEATURE = "Query rewriting"
MAX_QUERY_CHARS = 500
# Queries the model is asked for at most, and the weight of each one's ranking in the
# fusion (the question's own ranking weighs 1).
REWRITE_QUERIES = 3
REWRITE_WEIGHT = 0.5

PROMPT = """You help a search engine find passages in a person's notes, documents and \
conversations. Rewrite the question below into {n} different short search queries, each \
of which could find the passage that answers it: a plain paraphrase, the key names and \
terms, and words the answer itself would likely contain. Keep names, places, dates and \
numbers as they are. Answer with only a JSON object: {{"queries": ["...", "..."]}}"""
# The answer: the documented shape, and the variants models write (list keys; an object
# per query).
REWRITE = Shape(
    "search_queries",
    (ListSpec("queries", ("rewrites", "rewritten_queries", "search_queries", "questions",
                          "paraphrases", "results", "items"),
              text_keys=("query", "text", "q", "search", "content")),),
    example='{"queries": ["...", "..."]}',
)  # fmt: skip
EXAMPLE_QUESTION = "When did Anna move to Berlin?"
EXAMPLE_ANSWER = (
    '{"queries": ["Anna moved to Berlin", "Anna Berlin move date", '
    '"moving into a new apartment in Berlin"]}'
)


@dataclass
class RewrittenSearch:
    """The fused hits; the rewritten queries searched (none when the search ran as asked),
    the model that wrote them, and why there are none when the LLM failed."""

    hits: list[Hit]
    queries: list[str] = field(default_factory=list)
    model: str = ""
    error: str | None = None


def rewrite_queries(query: str, *, llm: ChatLLM) -> tuple[list[str], str]:
    """Up to ``REWRITE_QUERIES`` queries other than ``query`` written by ``llm``,
    and the model that answered. Raises ``ProviderError`` when the LLM fails,
    ``ValueError`` when its answer holds no usable query."""
    wanted = REWRITE_QUERIES
    kwargs: dict[str, Any] = {
        "temperature": 0,
        "max_tokens": 40 * wanted + 40,
        "timeout": settings.SEARCH_REWRITE_TIMEOUT,
    }
    answer = complete_answer(
        llm, rewrite_messages(query, wanted), shape=REWRITE, what="query_rewrite", **kwargs
    )
    model = answer.results[-1].model if answer.results else ""
    if answer.reading.malformed:
        raise ValueError(f"the model's answer was not JSON, twice: {answer.reading.reason}")
    queries = valid_queries(answer.reading.value.get("queries"), query, wanted)
    if not queries:
        raise ValueError("the model's answer held no usable query")
    return queries, model


def rewrite_messages(query: str, wanted: int) -> list[dict[str, str]]:
    """The rewrite asked of the LLM: the instructions, one worked example, the query."""
    return [
        {"role": "system", "content": PROMPT.format(n=wanted)},
        {"role": "user", "content": EXAMPLE_QUESTION},
        {"role": "assistant", "content": EXAMPLE_ANSWER},
        {"role": "user", "content": query},
    ]


def valid_queries(raw: object, original: str, limit: int) -> list[str]:
    """The usable strings of ``raw`` (a list): whitespace collapsed, with a word in them,
    at most ``MAX_QUERY_CHARS``, none repeating another or ``original`` (case aside);
    the first ``limit``."""
    out: list[str] = []
    seen = {_key(original)}
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, str):
            continue
        text = " ".join(item.split())
        if not re.search(r"\w", text) or len(text) > MAX_QUERY_CHARS or _key(text) in seen:
            continue
        seen.add(_key(text))
        out.append(text)
        if len(out) == limit:
            break
    return out


def _key(text: str) -> str:
    return " ".join(text.casefold().split())


def search_rewritten(
    *, bases: list[KnowledgeBase], request: SearchRequest, llm: ChatLLM | None = None
) -> RewrittenSearch:
    """``request`` searched with the LLM's rewritten queries, fused (module doc).

    Raises ``ProviderNotConfigured`` (503, names the variable) without an LLM, and
    ``SearchError`` for a request without a text query; an LLM failure of any kind
    answers the search as asked, with the reason."""
    if not request.query:
        raise SearchError("query rewriting needs a text query")
    llm = llm or get_llm(feature=FEATURE)
    try:
        with usage_for(owner_id=bases[0].owner_id if bases else None, kind="query_rewrite"):
            queries, model = rewrite_queries(request.query, llm=llm)
    except Exception as exc:  # any failure of the LLM: the search as asked, never an error
        error = f"{type(exc).__name__}: {exc}"[:300]
        logger.warning(json.dumps({"event": "query_rewrite_failed", "error": error}))
        return RewrittenSearch(search_chunks(bases=bases, request=request), error=error)
    rankings = [(1.0, search_chunks(bases=bases, request=request))]
    weight = REWRITE_WEIGHT
    for text in queries:
        # A rewritten query is text only: the caller's vector, if any, embeds the original.
        other = replace(request, query=text, vector=None)
        rankings.append((weight, search_chunks(bases=bases, request=other)))
    return RewrittenSearch(fuse_rankings(rankings, request.top_k), queries, model)


def fuse_rankings(rankings: list[tuple[float, list[Hit]]], top_k: int) -> list[Hit]:
    """The best ``top_k`` chunks by the sum over rankings of weight x score / the
    ranking's best score (a ranking whose best score is not positive counts by rank
    instead: 1 / rank). Each hit keeps its text, metadata and leg scores from the first
    ranking that holds it (the original query's, when it does); ties go to that order."""
    total: dict[int, float] = {}
    first: dict[int, tuple[int, int, Hit]] = {}
    for number, (weight, hits) in enumerate(rankings):
        best = max((h.score for h in hits), default=0.0)
        for rank, hit in enumerate(hits, start=1):
            share = hit.score / best if best > 0 else 1.0 / rank
            total[hit.chunk_id] = total.get(hit.chunk_id, 0.0) + weight * share
            first.setdefault(hit.chunk_id, (number, rank, hit))
    order = sorted(total, key=lambda cid: (-total[cid], first[cid][0], first[cid][1], cid))
    out = []
    for chunk_id in order[:top_k]:
        hit = first[chunk_id][2]
        hit.score = total[chunk_id]
        out.append(hit)
    return out
