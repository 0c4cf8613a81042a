"""The one search of facts: every door searches a scope's facts through ``fact_search``
(``POST /api/v1/users/{id}/memories/search``, ``/api/v1/engine/search``, the injection
of ``/api/v1/engine/injection`` and of the chat proxy, the tools and MCP), so the same
query on the same scope returns the same facts in the same order whichever door asks.

Facts are a collection of the retrieval engine (``knowledge.retrieval``, ``FACTS``): a
scope's own facts (``scope_id``) and the few it shares with other scopes (its ``shared``
links), ranked by cosine similarity (exactly through the facts' 16-bit copies, or
through the HNSW index for a scope past ``exact_max`` that also holds a good share of the
table or more than ``exact_cap`` facts) and by keyword (any query word, BM25 with the
scope's statistics), fused as ``VECTOR_WEIGHT`` x similarity + the rest x the keyword
score over the best one's, times the decay of the fact's age (when it was said); equal
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

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from core.errors import InvalidInput
from core.providers.embeddings import Embedder, get_embedder
from knowledge.retrieval.bm25 import counted_leg
from knowledge.retrieval.dates import dated
from knowledge.retrieval.engine import Collection, Leg, Ranking, rank
from knowledge.retrieval.engine import Scope as Rows
from knowledge.retrieval.vectors import vector_leg
from memories.facts.models import Scope
from memories.facts.scopes import ScopePath, global_scope_find, scope_find, scope_parse
from memories.facts.timeline import At

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
    valid_from: datetime | None = field(default=None, kw_only=True)
    valid_to: datetime | None = field(default=None, kw_only=True)
    recorded_from: datetime | None = field(default=None, kw_only=True)
    recorded_to: datetime | None = field(default=None, kw_only=True)

    @property
    def pk(self) -> uuid.UUID:
        return self.id


@dataclass
class SearchResult:
    hits: list[FactHit]
    mode: str  # "hybrid" or "keyword" (the embedder failed or there was no vector)
    embedder_error: str | None = None


@dataclass
class FactFilter:
    categories: list[str] | None = None
    min_confidence: float | None = None

    def sql(self, alias: str = "") -> tuple[str, list[Any]]:
        parts: list[str] = []
        params: list[Any] = []
        if self.categories:
            parts.append(f"{alias}category = ANY(%s)")
            params.append(list(self.categories))
        if self.min_confidence is not None:
            parts.append(f"{alias}confidence >= %s")
            params.append(self.min_confidence)
        return "".join(f" AND {p}" for p in parts), params


FACTS = Collection(
    name="facts",
    table="memories_fact",
    index_prefix="fact_hnsw",
    id_type="uuid",
    details=(
        "t.id, t.content, t.category, t.confidence, t.source_kind, t.source_ref, t.metadata, "
        "t.observed_at, t.created_at, t.updated_at, t.valid_from, t.valid_to, "
        "coalesce(t.recorded_at, t.created_at) AS recorded_from, NULL::timestamptz AS recorded_to"
    ),
    time="observed_at",
    event_time="observed_at",  # (a date the query names lifts the facts said then)
    tiebreak="{top}.o DESC, {top}.id",
    fusion="max",
    # w, tuned on LoCoMo facts (BENCHMARKS.md, "The engine's keyword leg is BM25 now").
    vector_weight=0.5,
    copies="memories_fact_half",  # (migration 0008)
    pending="index_pending",  # an import's facts, ranked exactly until indexed (0017)
    # Past 2,000 facts a scope walks the HNSW index if it also holds 5% of the table or
    # more than 20,000 facts (a walk filtered to a rare scope visits many nodes of other
    # scopes: 10,000 facts among 1M are ranked faster exactly).
    exact_max=2000,
    walk_min_share=0.05,
    exact_cap=20_000,
    # pgvector's default (a walked scope is large and most of its table): at least twice
    # the 30 candidates, so 60, whose walk found 99.3% of the exact top 10 of MiniLM
    # vectors where 100 found 99.7% (BENCHMARKS.md, "The engine's search beside mem0's,
    # again"), in three quarters of the time. Past 100,000 facts in the index the walk
    # goes as deep as the other collections' (measured on smaller indexes only).
    ef_search=40,
)
# Facts in time (``timeline``): current facts and their closed versions, ranked the same
# way, always exactly (a read of the past is rare; no index holds closed versions). Each
# row's ``id`` is its own (a version's); a hit answers its fact's id.
TIMELINE = Collection(
    name="fact timeline",
    table="memories_fact_timeline",
    index_prefix="fact_timeline_hnsw",  # (none: exact)
    id_type="uuid",
    details=FACTS.details.replace("t.id,", "t.fact_id AS id,", 1).replace(
        "coalesce(t.recorded_at, t.created_at) AS recorded_from, NULL::timestamptz AS recorded_to",
        "t.recorded_from, t.recorded_to",
    ),
    time="observed_at",
    event_time="observed_at",
    tiebreak=FACTS.tiebreak,
    fusion=FACTS.fusion,
    vector_weight=FACTS.vector_weight,
)
# Decay: a fact's score halves every this many days of its age (0: no decay).
HALF_LIFE_DAYS = 30.0
# The facts a scope shares with others (linked to several scopes: no ``scope_id``).
_SHARED = "SELECT fact_id FROM memories_factlink WHERE scope_id = %s AND shared"
_SIZE = "SELECT fact_count FROM memories_scope WHERE id = %s"  # (kept by triggers: 0009)
_TOTALS = (
    "SELECT e.n + s.n, e.l + s.l FROM (SELECT coalesce(sum(text_facts), 0) AS n,"
    " coalesce(sum(text_lexemes), 0) AS l FROM memories_scope WHERE id = %s) e,"
    " (SELECT count(*) AS n, coalesce(sum(length(search_vector) - 1), 0) AS l"
    f" FROM memories_fact WHERE id IN ({_SHARED}) AND scope_id IS NULL) s"
)


def fact_vector_leg(
    row: Scope, vector: Sequence[float], model: str, pool: int, filter: FactFilter | None = None
) -> Leg:
    """The vector leg of a scope's facts of ``model``: (id, distance, walked, time)."""
    where, params = (filter or FactFilter()).sql()
    dims = len(vector)
    scope = Rows(
        f"scope_id = %s AND dimensions = {dims} AND embedding_model = %s{where}",
        [row.pk, model, *params],
        size=(_SIZE, [row.pk]),
        extra=(
            f"id IN ({_SHARED}) AND scope_id IS NULL AND embedding_model = %s{where}",
            [row.pk, model, *params],
        ),
    )
    return vector_leg(FACTS, scope, dims, vector, pool)


def fact_keyword_leg(
    row: Scope, text: str, pool: int, filter: FactFilter | None = None
) -> Leg | None:
    """The keyword leg of a scope's facts: (id, BM25 score, time), the statistics the
    whole scope's whatever the filter (None for a text without words)."""
    where, params = (filter or FactFilter()).sql()
    shared_where, _ = (filter or FactFilter()).sql("v.")
    shared = (
        f"SELECT v.id, v.search_vector, v.observed_at, (true{shared_where}) FROM q,"
        f" memories_fact v WHERE v.id IN ({_SHARED}) AND v.scope_id IS NULL"
        " AND numnode(q.words) > 0 AND v.search_vector @@ q.words"
    )
    return counted_leg(
        table="memories_fact", token=f"~scope:{row.pk}", text=text, pool=pool,
        newest="observed_at", filter=("true" + where, params),
        extra=(shared, [*params, row.pk]), totals=(_TOTALS, [row.pk, row.pk]),
    )  # fmt: skip


def _past_legs(row: Scope, text: str, q: QueryVector, pool: int, vector_pool: int, at: At,
               filter: FactFilter | None) -> tuple[Leg | None, Leg | None]:  # fmt: skip
    """The vector and keyword legs over the scope's timeline at ``at``: its own versions
    (``scope_id``) and the current facts it shares. Document frequencies count every
    version holding a query word; N and the mean length are those of the versions
    believed at ``at``."""
    where, params = (filter or FactFilter()).sql()
    when, when_params = at.sql()
    cond, cond_params = f" AND {when}{where}", [*when_params, *params]
    vector: Leg | None = None
    if q.vector is not None and q.model is not None:
        dims = len(q.vector)
        scope = Rows(
            f"scope_id = %s AND dimensions = {dims} AND embedding_model = %s{cond}",
            [row.pk, q.model, *cond_params], rows=0,
            extra=(f"id IN ({_SHARED}) AND scope_id IS NULL AND embedding_model = %s{cond}",
                   [row.pk, q.model, *cond_params]),
        )  # fmt: skip
        vector = vector_leg(TIMELINE, scope, dims, q.vector, vector_pool)
    vwhen, _ = at.sql("v.")
    vwhere, _ = (filter or FactFilter()).sql("v.")
    shared = (
        f"SELECT v.id, v.search_vector, v.observed_at, ({vwhen}{vwhere}) FROM q,"
        f" memories_fact_timeline v WHERE v.id IN ({_SHARED}) AND v.scope_id IS NULL"
        " AND numnode(q.words) > 0 AND v.search_vector @@ q.words"
    )
    totals = (
        "SELECT count(*), coalesce(sum(length(search_vector) - 1), 0) FROM"
        f" memories_fact_timeline WHERE (scope_id = %s OR (scope_id IS NULL AND id IN"
        f" ({_SHARED}))) AND {when}"
    )
    keyword = counted_leg(
        table="memories_fact_timeline", token=f"~scope:{row.pk}", text=text, pool=pool,
        newest="observed_at", filter=(f"true{cond}", cond_params),
        extra=(shared, [*cond_params, row.pk]), totals=(totals, [row.pk, row.pk, *when_params]),
    )  # fmt: skip
    return vector, keyword


def fact_nearest(row: Scope, vector: Sequence[float], model: str) -> tuple[uuid.UUID, float] | None:
    """The scope's fact of ``model`` nearest ``vector`` and its similarity (the semantic
    duplicate check): exact, or through the index for a large scope (a near duplicate is
    near: the walk does not miss it)."""
    rows = fact_vector_leg(row, vector, model, 1).run()
    return (rows[0][0], 1.0 - float(rows[0][1])) if rows else None


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


# Candidates each leg hands to fusion (decay reorders them): the keyword leg's, 5x what
# is asked, at least 50 (a posting list: cheap); the vector leg's, 3x, at least 30 (a walk
# of the index costs in proportion to them: ef_search is at least twice the rows it
# wants). 30 ranked LoCoMo's facts as 50 did (R@5 and R@10 the same; BENCHMARKS.md, "The
# engine's search beside mem0's, again") in two thirds of a 10,000-fact scope's walk.
POOL_FACTOR, POOL_MIN = 5, 50
VECTOR_POOL_FACTOR, VECTOR_POOL_MIN = 3, 30


def _pool(limit: int, offset: int) -> int:
    return max(POOL_FACTOR * (limit + offset), POOL_MIN)


def _vector_pool(limit: int, offset: int) -> int:
    return max(VECTOR_POOL_FACTOR * (limit + offset), VECTOR_POOL_MIN)


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
    at: At | None = None,
) -> SearchResult:
    """The scope's facts best matching ``query``: min(limit, matching) of them from
    ``offset``. Hybrid when the query can be embedded (every fact of the embedding model
    matches), keyword-only when the embedder fails (facts sharing a word match).
    ``half_life_days`` (``HALF_LIFE_DAYS`` when None, 0 = none) decays the score
    by the age of the fact (when it was said). A scope path the owner does not have
    finds nothing. ``include_globals``: the owner's global memories, searched the same
    way in their own scope (same query, limit and offset), fill what the scope's hits
    leave of the ``limit``. ``at``: the facts believed or true then (``timeline``), not
    the current ones."""
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
                         half_life_days=half_life_days, at=at)  # fmt: skip
    if include_globals and len(found.hits) < limit:
        glob = global_scope_find(owner=owner)
        if glob is not None and (row is None or glob.pk != row.pk):
            more = scope_search(glob, query, q, limit=limit, offset=offset, filter=filter,
                                half_life_days=half_life_days, at=at)  # fmt: skip
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
    at: At | None = None,
) -> SearchResult:
    """``fact_search`` of one scope row with the query embedded (``query_embed``)."""
    mode = "keyword" if q.vector is None else "hybrid"
    if row is None:
        return SearchResult([], mode, q.error)
    pool, vector_pool = _pool(limit, offset), _vector_pool(limit, offset)
    half_life = HALF_LIFE_DAYS if half_life_days is None else half_life_days
    empty = Leg("", [], [], rows=[])  # keyword-only: the keyword score alone, over the best
    collection, vector, keyword = FACTS, None, None
    if at is not None and at.past:
        collection = TIMELINE
        vector, keyword = _past_legs(row, query, q, pool, vector_pool, at, filter)
    else:
        if q.vector is not None and q.model is not None:
            vector = fact_vector_leg(row, q.vector, q.model, vector_pool, filter)
        keyword = fact_keyword_leg(row, query, pool, filter)
    ranking = Ranking(
        limit=limit, offset=offset, half_life=half_life,
        now=at.when() if at is not None else timezone.now(),
        vector_weight=None if q.vector is not None else 0.0, dated=dated(query),
    )  # fmt: skip
    path = tuple(row.path)
    hits = [_hit(hit, path) for hit in rank(collection, vector or empty, keyword or empty,
                                            ranking)]  # fmt: skip
    return SearchResult(hits, mode, q.error)


def _hit(row: dict[str, Any], path: tuple[str, ...]) -> FactHit:
    metadata = row["metadata"]
    if isinstance(metadata, str):  # (Django's connections load jsonb as its text)
        metadata = json.loads(metadata)
    vscore, kscore = row["vscore"], row["kscore"]
    return FactHit(
        id=row["id"], content=row["content"], category=row["category"],
        confidence=row["confidence"], source_kind=row["source_kind"],
        source_ref=row["source_ref"], metadata=metadata, observed_at=row["observed_at"],
        created_at=row["created_at"], updated_at=row["updated_at"],
        similarity=None if vscore is None else float(vscore),
        keyword_score=None if kscore is None else float(kscore), score=float(row["score"]),
        scope_path=path, valid_from=row["valid_from"], valid_to=row["valid_to"],
        recorded_from=row["recorded_from"], recorded_to=row["recorded_to"],
    )  # fmt: skip
