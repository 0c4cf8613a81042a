"""Search of knowledge-base chunks: the chunks as a collection of the retrieval engine
(``knowledge.retrieval``), with the filters a search may name.

Hybrid (the default) fuses the vector and keyword (BM25) legs with min-max weights and
lets neighbouring turns of a conversation pass context; ``vector`` and ``keyword`` rank
by one leg. A search over bases of several embedding models or languages runs one leg
per model or language and merges them.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from django.db import connection
from django.utils import timezone

from core.errors import InvalidInput
from knowledge.models import KnowledgeBase
from knowledge.retrieval import bm25
from knowledge.retrieval.dates import Dated, dated
from knowledge.retrieval.db import Statement, fetch
from knowledge.retrieval.engine import (
    SCALED,
    Collection,
    Context,
    Lane,
    Leg,
    Lift,
    Ranking,
    Scope,
    rank,
    statement,
)
from knowledge.retrieval.vectors import vector_leg
from knowledge.selectors import kb_embedder

MODES = ("hybrid", "vector", "keyword")
FILTER_KEYS = (
    "session_id",
    "flow_id",
    "source_type",
    "run_id",
    "message_id",
    "sender",
    "file_path",
)
# From this many chunks in the searched bases (outside a transaction) the legs run at
# once on two connections, then one statement fuses them: the longer leg's time
# instead of both (BENCHMARKS.md, "Hybrid search at 100k, split legs").
SPLIT_MIN_ROWS = 2000

# The filters the chunks' 16-bit copies can answer (knowledge 0018): with any other, an
# exact ranking reads the chunk table.
COPIED = ("session_id",)

_DETAILS = (
    "id, knowledge_base_id, text, source_key, document_key, chunk_index, chunk_total, "
    "source_type, message_id, session_id, flow_id, run_id, sender, file_path, content_hash, "
    "source_timestamp, metadata, created_at"
)
CHUNKS = Collection(
    name="chunks",
    table="knowledge_chunk",
    index_prefix="chunk_hnsw",
    id_type="bigint",
    details=", ".join(f"t.{col}" for col in _DETAILS.split(", ")),
    time="coalesce(source_timestamp, created_at)",
    tiebreak="coalesce({top}.vrank, 1000000000), coalesce({top}.krank, 1000000000), {top}.id",
    fusion="minmax",
    vector_weight=0.4,
    # Context stays inside a conversation (a session's turns, in time order) or one
    # document (its chunks, in order): separate documents lend each other nothing.
    context=Context(
        lanes=(
            Lane(
                "c.session_id <> ''",
                ("knowledge_base_id", "session_id"),
                ("source_timestamp", "id"),
            ),
            Lane(
                "true", ("knowledge_base_id", "document_key", "session_id"), ("chunk_index", "id")
            ),
        ),
    ),  # fmt: skip
    pending="index_pending",
    copies="knowledge_chunk_half",  # (migration 0018)
    # Past 10,000 chunks a scope walks the HNSW index if it also holds 5% of the table or
    # more than 20,000 chunks, as facts do: a walk filtered to a rare slice (a session of
    # a large base) visits many nodes of other slices, where the slice's copies are
    # ranked exactly in less time (BENCHMARKS.md, "A million chunks: 16-bit copies").
    exact_max=10_000,
    walk_min_share=0.05,
    exact_cap=20_000,
    # A turn of a conversation (a chunk with a session) was said at its timestamp; a
    # document's timestamp is its ingestion time unless given, which is not when its text
    # was said: a date the query names lifts turns only (``dates``).
    event_time="CASE WHEN session_id <> '' THEN source_timestamp END",
    cues=(
        # A turn by a speaker: its sender, or the name its text opens with ("Caroline: ...").
        (
            "speaker",
            "session_id <> '' AND lower(CASE WHEN sender <> '' THEN sender"
            " ELSE split_part(left(text, 41), ':', 1) END) = %s",
        ),
        # A turn that tells a time ("last week", "two days ago"), as its lexemes hold it.
        ("tells_time", "session_id <> '' AND search_vector @@ %s::tsquery"),
    ),
)


class SearchError(InvalidInput):
    pass


@dataclass(frozen=True)
class SearchRequest:
    query: str | None = None
    vector: Sequence[float] | None = None
    top_k: int = 10
    mode: str = "hybrid"
    similarity_threshold: float | None = None
    filters: dict[str, Any] = field(default_factory=dict)
    since: datetime | None = None
    until: datetime | None = None
    rrf_k: int | None = None  # fuse by reciprocal ranks at this k
    half_life_days: float | None = None
    # Hybrid search: lift the turns said in a period the query names ("in June", "on May
    # 23, 2023": ``knowledge.retrieval.dates``) or by the one speaker it names
    # (``SPEAKER_LIFT``).
    query_cues: bool = True


@dataclass
class Hit:
    chunk_id: int
    knowledge_base_id: str
    score: float
    vector_score: float | None = None
    vector_rank: int | None = None
    keyword_score: float | None = None
    keyword_rank: int | None = None
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


def _scope(kb_ids: list[str], request: SearchRequest, alias: str = "") -> tuple[str, list[Any]]:
    clauses = [f"{alias}knowledge_base_id = ANY(%s::uuid[])"]
    params: list[Any] = [kb_ids]
    for key in FILTER_KEYS:
        if key in request.filters:
            clauses.append(f"{alias}{key} = %s")
            params.append(str(request.filters[key]))
    # (the (knowledge_base, source_timestamp) index serves a time range)
    if request.since is not None:
        clauses.append(f"{alias}source_timestamp >= %s")
        params.append(request.since)
    if request.until is not None:
        clauses.append(f"{alias}source_timestamp < %s")
        params.append(request.until)
    return " AND ".join(clauses), params


def _filtered(request: SearchRequest) -> bool:
    return any(k in request.filters for k in FILTER_KEYS) or (
        request.since is not None or request.until is not None
    )


def _scope_of(bases: list[KnowledgeBase], request: SearchRequest) -> Scope:
    kb_ids = [str(kb.pk) for kb in bases]
    sql, params = _scope(kb_ids, request)
    rows = None if _filtered(request) else sum(kb.chunk_count for kb in bases)
    # The copies hold the base, the session and the time a filter can name, not the rest.
    in_copies = all(key not in request.filters for key in FILTER_KEYS if key not in COPIED)
    return Scope(sql, params, rows, size=_session_size(kb_ids, request), in_copies=in_copies)


def _session_size(kb_ids: list[str], request: SearchRequest) -> tuple[str, list[Any]] | None:
    """A search filtered to a session only: its chunks' count, one row a base
    (``knowledge_session_stats``, migration 0019), where its rows would be counted. It
    only steers exact or walk: a count that were off would cost time, never rows."""
    if set(request.filters) & set(FILTER_KEYS) != {"session_id"}:
        return None
    if request.since is not None or request.until is not None:
        return None
    return (
        "SELECT sum(chunks) FROM knowledge_session_stats"
        " WHERE knowledge_base_id = ANY(%s::uuid[]) AND session_id = %s",
        [kb_ids, str(request.filters["session_id"])],
    )


def _neighbours(request: SearchRequest, kb_ids: list[str]) -> tuple[str, list[Any]]:
    """What a neighbour that is no candidate must meet to be a hit (row ``t``): the
    search's filters other than its session, which it shares with its donor."""
    others = [key for key in request.filters if key in FILTER_KEYS and key != "session_id"]
    if not others and request.since is None and request.until is None:
        return "true", []
    return _scope(kb_ids, request, alias="t.")


# A name most of the searched chunks carry (a conversation's speakers, written before
# each of their turns: "Caroline: ...") tells the vector leg little about which chunk
# answers, and pulls the query's embedding toward all of them. So a capitalised word of
# the query (not its first word) whose lexeme at least COMMON_NAME_SHARE of the bases'
# chunks hold is left out of the text the vector leg embeds; the keyword leg keeps it
# (BM25 weighs it by its rarity). So is a word that is the sender of a turn (``Names``):
# a chat stored with its senders need not write their names in its text, and the speaker
# lift carries what the name says. BENCHMARKS.md, "Retrieval quality, round two".
COMMON_NAME_SHARE = 0.1
MAX_NAMES = 32  # (the first, alphabetically, of a query's capitalised words: each a lookup)
_NAME = re.compile(r"(?<=\W)([A-Z][\w-]*)(?:'s)?")
_SHARES_SQL = """
SELECT w.word, coalesce(max(s.df::float8 / t.n), 0), coalesce(bool_or(p.said), false)
FROM unnest(%s::text[]) AS w(word)
CROSS JOIN (
    SELECT greatest(coalesce(sum(chunks), 0), 1)::float8 AS n
    FROM knowledge_base_text_stats WHERE knowledge_base_id = ANY(%s::uuid[])
) t
LEFT JOIN LATERAL (
    SELECT sum(df) AS df FROM knowledge_term_stats
    WHERE knowledge_base_id = ANY(%s::uuid[])
      AND lexeme = ANY(tsvector_to_array(to_tsvector(%s::regconfig, w.word)))
) s ON true
-- A turn sent by the word as the query writes it, in lower or upper case, or capitalised
-- ("Ann", "ann", "ANN"): an index lookup of each spelling (chunk_kb_turn_sender, knowledge
-- 0022; row-level security keeps an index on lower(sender) from serving it: lower() is not
-- leakproof). Ordered as that index is, so that the planner never reads the base's turns
-- through the base's own index instead: where a base's turns have one or two senders, it
-- estimates that any spelling is sent by most of them and that four spellings cost more
-- than one pass over the base.
LEFT JOIN LATERAL (
    SELECT true AS said FROM knowledge_chunk c
    WHERE c.knowledge_base_id = ANY(%s::uuid[]) AND c.session_id <> '' AND c.sender <> ''
      AND c.sender = ANY(ARRAY[w.word, lower(w.word), upper(w.word), initcap(w.word)])
    ORDER BY c.knowledge_base_id, c.sender
    LIMIT 1
) p ON true
GROUP BY w.word
"""


@dataclass(frozen=True)
class Names:
    """The capitalised words of a query (past its first) that name who the searched chunks
    are by: the words whose lexeme at least ``COMMON_NAME_SHARE`` of the chunks hold (a
    conversation's speakers written before their turns, "Caroline: ..."), and the
    ``sender`` of a turn (a chunk with a session; "Ann" or "ANN" for ``Ann``, ``ann`` or
    ``ANN``). ``unembedded``: those words as the query writes them, which the vector leg
    leaves out; ``speakers``: the senders among them, or else the common ones (where the
    chunks have no sender), lowercased, as the speaker lift compares them: "What did Ann
    say about Decathlon?" names one speaker in a chat about the shop."""

    unembedded: frozenset[str] = frozenset()
    speakers: frozenset[str] = frozenset()


NO_NAMES = Names()


def query_names(members: list[KnowledgeBase], query: str) -> Names:
    """The names ``query`` holds among ``members``' chunks (``Names``): one small
    statement, only for a query with a capitalised word past its first."""
    names = sorted({m.group(1) for m in _NAME.finditer(query)})[:MAX_NAMES]
    if not names:
        return NO_NAMES
    kb_ids = [str(kb.pk) for kb in members]
    rows, _ = fetch(_SHARES_SQL, [names, kb_ids, kb_ids, members[0].language, kb_ids])
    common = {word for word, share, _ in rows if share >= COMMON_NAME_SHARE}
    senders = {word for word, _, sent in rows if sent}
    return Names(frozenset(common | senders), frozenset(word.lower() for word in senders or common))


def vector_text(members: list[KnowledgeBase], query: str, common: set[str] | None = None) -> str:
    """``query`` without the names of who ``members``' chunks are by (``common``, or
    ``query_names``): what the vector leg embeds."""
    common = set(query_names(members, query).unembedded) if common is None else common
    if not common:
        return query
    kept = _NAME.sub(lambda m: "" if m.group(1) in common else m.group(0), query)
    return " ".join(kept.split()) or query


def _query_vector(
    members: list[KnowledgeBase], request: SearchRequest, common: set[str] | None = None
) -> np.ndarray:
    dims = members[0].embedding_dimensions
    if request.vector is None:
        text = vector_text(members, request.query or "", common)
        return kb_embedder(members[0]).embed([text])[0]
    vector = np.asarray(request.vector, dtype=np.float32)
    if vector.shape != (dims,):
        said = f"has {vector.shape[0]} dimensions; knowledge base {members[0].name!r} uses {dims}"
        raise SearchError(f"vector: {said}", details={"vector": said})
    return vector


def _merged(legs: list[Leg], key: Any, limit: int) -> Leg | None:
    """One leg, or several run and merged (bases of several models or languages)."""
    if len(legs) <= 1:
        return legs[0] if legs else None
    rows = sorted((row for leg in legs for row in leg.run()), key=key)[:limit]
    return Leg("", [], [], rows=rows)


def _vector_leg(
    bases: list[KnowledgeBase], request: SearchRequest, pool: int, common: set[str] | None = None
) -> Leg | None:
    """The vector leg (one per embedding model, merged). ``common``: the query's names
    over ``bases`` (``Names.unembedded``), what a single model's leg leaves out of the
    text it embeds; with several models each group's own are found."""
    groups: dict[tuple[str, str, int], list[KnowledgeBase]] = defaultdict(list)
    for kb in bases:
        groups[(kb.embedding_provider, kb.embedding_model, kb.embedding_dimensions)].append(kb)
    if len(groups) > 1:
        common = None
    legs = [
        vector_leg(
            CHUNKS,
            _scope_of(members, request),
            key[2],
            _query_vector(members, request, common),
            pool,
        )
        for key, members in groups.items()
    ]
    return _merged(legs, lambda r: (r[1], r[0]), pool)


def _keyword_leg(bases: list[KnowledgeBase], request: SearchRequest, pool: int) -> Leg:
    by_language: dict[str, list[KnowledgeBase]] = defaultdict(list)
    for kb in bases:
        by_language[kb.language].append(kb)
    session = request.filters.get("session_id")
    legs = []
    for language, members in by_language.items():
        leg = bm25.chunk_leg(
            [str(kb.pk) for kb in members], language, request.query or "",
            _scope_of(members, request), pool, _filtered(request),
            None if session is None else str(session),
        )  # fmt: skip
        if leg is not None:
            legs.append(leg)
    return _merged(legs, lambda r: (-r[1], r[0]), pool) or Leg("", [], [], rows=[])


# The turns of the one speaker a query names (``Names.speakers``: a common name of the
# searched chunks or a turn's sender; a turn's ``CHUNKS.speaker``) have their own score s lifted
# to s + (1 - s) x SPEAKER_LIFT, before context: "Where has Melanie camped?" is answered
# by Melanie's turns (97% of LoCoMo dev's evidence turns for a question naming one
# speaker). A query naming both (or no) speakers lifts none. BENCHMARKS.md, "The speaker
# the question names".
SPEAKER_LIFT = 0.3
# A question asking when ("When did ...", "What year ...", "In which month ...", "How
# many weeks ago ...") is answered by a turn that tells a time, mostly relative to the day
# it was said ("last week", "two weekends ago"): such turns are lifted by TIME_LIFT.
TIME_LIFT = 0.2
_ASKS_WHEN = re.compile(
    r"^\W*(?:(?:in|on|during|around|by|since|until)\s+)?"
    r"(?:when\b|(?:what|which)\s+(?:year|month|week|weekend|day|date|time)(?![\w'-]))"
    r"|\bhow\s+(?:long|many\s+(?:days|weeks|weekends|months|years))\s+ago\b",
    re.IGNORECASE,
)
# English lexemes (stemmed: "morn" for morning, "recent" for recently, "late" for lately;
# a test holds them to the English stemmer) of a time told relative to the day: one, or
# "last"/"next" before a unit or a day's name.
_UNITS = (
    "week | weekend | month | year | night | morn | summer | winter | spring | fall"
    " | autumn | monday | tuesday | wednesday | thursday | friday | saturday | sunday"
)
TIME_WORDS = (
    "yesterday | today | tonight | tomorrow | ago | recent | earlier | late"
    f" | last <-> ({_UNITS}) | next <-> ({_UNITS})"
)


def _cues(request: SearchRequest, names: Names) -> tuple[Dated | None, tuple[Lift, ...]]:
    """What the query names that lifts turns (hybrid search only): the periods, the one
    speaker, a question asking when."""
    if not request.query_cues or request.mode != "hybrid" or not request.query:
        return None, ()
    lifts = []
    if len(names.speakers) == 1:
        lifts.append(Lift("speaker", (next(iter(names.speakers)),), SPEAKER_LIFT))
    if TIME_LIFT and _ASKS_WHEN.search(request.query):
        lifts.append(Lift("tells_time", (TIME_WORDS,), TIME_LIFT))
    return dated(request.query), tuple(lifts)


def _validate(request: SearchRequest) -> None:
    if request.mode not in MODES:
        raise SearchError(f"mode must be one of {', '.join(MODES)}")
    if request.mode == "keyword" and not request.query:
        raise SearchError("keyword search needs a text query")


def _plan(
    bases: list[KnowledgeBase], request: SearchRequest
) -> tuple[Leg | None, Leg | None, Ranking]:
    """The search's legs and how they are fused."""
    _validate(request)
    top_k = request.top_k
    pool = top_k if request.mode != "hybrid" else max(top_k * 3, SCALED)
    # The names the vector leg's text leaves out (when it embeds the query), the speaker a
    # hybrid search lifts: one statement for both, only for a query with a capitalised word.
    embeds = request.vector is None and request.mode != "keyword"
    cues = request.query_cues and request.mode == "hybrid"
    names = query_names(bases, request.query) if request.query and (embeds or cues) else NO_NAMES
    common = set(names.unembedded)
    vector = _vector_leg(bases, request, pool, common) if request.mode != "keyword" else None
    keyword = None
    if request.mode == "keyword" or (request.mode == "hybrid" and request.query):
        keyword = _keyword_leg(bases, request, pool)
    if request.mode == "hybrid" and keyword is None:
        keyword = Leg("", [], [], rows=[])  # (a vector alone: still fused, with context)
    threshold = request.similarity_threshold
    dated_, lifts = _cues(request, names)
    ranking = Ranking(
        limit=top_k,
        rrf_k=request.rrf_k,
        max_distance=None if threshold is None else 1.0 - threshold,
        half_life=request.half_life_days,
        now=timezone.now(),
        neighbours=_neighbours(request, [str(kb.pk) for kb in bases]),
        dated=dated_,
        lifts=lifts,
    )
    return vector, keyword, ranking


def search_chunks(*, bases: list[KnowledgeBase], request: SearchRequest) -> list[Hit]:
    """Rank chunks of ``bases`` for ``request``; returns at most ``top_k`` hits."""
    if not bases:
        _validate(request)
        return []
    vector, keyword, ranking = _plan(bases, request)
    rows = sum(kb.chunk_count for kb in bases)
    split = rows >= SPLIT_MIN_ROWS and not connection.in_atomic_block
    return [hit_of(row) for row in rank(CHUNKS, vector, keyword, ranking, split)]


def chunk_statement(*, bases: list[KnowledgeBase], request: SearchRequest) -> Statement:
    """``search_chunks`` as one statement, for a caller that sends it beside statements of
    its own (a memory store's retrieve call); its rows give hits through ``hit_of``."""
    return statement(CHUNKS, *_plan(bases, request))


def hit_of(row: dict[str, Any]) -> Hit:
    extra = row.pop("metadata") or {}
    if isinstance(extra, str):  # Django's connection loads jsonb as text
        extra = json.loads(extra)
    timestamp = row.pop("source_timestamp")
    vscore, kscore = row.pop("vscore"), row.pop("kscore")
    hit = Hit(
        chunk_id=row.pop("id"),
        knowledge_base_id=str(row.pop("knowledge_base_id")),
        score=float(row.pop("score")),
        vector_score=None if vscore is None else float(vscore),
        vector_rank=row.pop("vrank"),
        keyword_score=None if kscore is None else float(kscore),
        keyword_rank=row.pop("krank"),
        text=row.pop("text"),
    )
    row.pop("created_at")
    hit.metadata = {**extra, **row, "timestamp": timestamp.isoformat() if timestamp else None}
    return hit
