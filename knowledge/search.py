"""Retrieval over chunks: vector, keyword (BM25 over Postgres full text) and hybrid.

The rule this module keeps: a filtered search returns min(top_k, matching rows).
An HNSW scan with a filter applied afterwards can return fewer rows or none (the
index hands back its ef_search nearest rows, and the filter may drop them all).
So small scopes take an exact scan, large scopes use pgvector 0.8's iterative
index scan where the server has it, and any index scan that comes back short is
redone exactly. Rows still waiting for the background HNSW indexer
(``index_pending``) are ranked exactly next to the index scan, so a chunk is
findable from the moment its write commits.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache, lru_cache
from typing import Any, TypeVar

import numpy as np
import psycopg
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from core.errors import InvalidInput
from core.health import pgvector_supports_iterative_scan, pgvector_version
from core.scoring import decay
from knowledge import bm25, fusion, prepared
from knowledge.bm25 import bm25_ranking
from knowledge.models import INDEXED_DIMENSIONS, KnowledgeBase
from knowledge.selectors import kb_embedder

T = TypeVar("T")
U = TypeVar("U")
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
    # A hybrid search fuses with RRF at this k when it is given, else as SEARCH_FUSION says.
    rrf_k: int | None = None
    half_life_days: float | None = None


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


@lru_cache(maxsize=1)
def _iterative_scan_available() -> bool:
    return pgvector_supports_iterative_scan(pgvector_version())


def _scope_sql(kb_ids: list[str], request: SearchRequest, alias: str = "") -> tuple[str, list[Any]]:
    clauses = [f"{alias}knowledge_base_id = ANY(%s::uuid[])"]
    params: list[Any] = [kb_ids]
    for key in FILTER_KEYS:
        if key in request.filters:
            clauses.append(f"{alias}{key} = %s")
            params.append(str(request.filters[key]))
    # Every chunk has a source_timestamp (ingestion stamps one when the metadata has
    # none), so a time range can use the (knowledge_base, source_timestamp) index.
    if request.since is not None:
        clauses.append(f"{alias}source_timestamp >= %s")
        params.append(request.since)
    if request.until is not None:
        clauses.append(f"{alias}source_timestamp < %s")
        params.append(request.until)
    return " AND ".join(clauses), params


def _exact_vector(
    scope: str, params: list[Any], vec: str, limit: int, max_distance: float | None
) -> list[tuple[int, float]]:
    threshold = " AND embedding <=> %s::vector <= %s" if max_distance is not None else ""
    extra = [vec, max_distance] if max_distance is not None else []
    # Ordering by the uncast column cannot use the per-dimension expression
    # indexes, so this is always an exact scan of the (filtered) scope.
    sql = (
        f"SELECT id, embedding <=> %s::vector AS d FROM knowledge_chunk "
        f"WHERE {scope}{threshold} ORDER BY d, id LIMIT %s"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [vec, *params, *extra, limit])  # type: ignore[list-item]
        return [(row[0], float(row[1])) for row in cur.fetchall()]


@cache
def _index_type(dims: int) -> str:
    """The type the HNSW index of ``dims`` is built on: ``halfvec`` (migration 0011, on
    pgvector >= 0.7), else ``vector`` (0004's index, kept on older pgvector)."""
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [f"chunk_hnsw_half_{dims}"])
        return "halfvec" if cur.fetchone()[0] else "vector"


def _index_name(dims: int) -> str:
    return f"chunk_hnsw_half_{dims}" if _index_type(dims) == "halfvec" else f"chunk_hnsw_{dims}"


def _index_vector(
    scope: str, params: list[Any], vec: str, dims: int, limit: int
) -> tuple[list[tuple[int, float]], int]:
    """HNSW ranking of the indexed rows merged with an exact ranking of the pending ones.

    Returns ([(chunk id, distance)] nearest first, rows the index scan returned). The
    index ranks by its type (``halfvec``: 16-bit floats); the distance handed back, which
    orders the result, is the exact one of the stored vectors.
    """
    kind = _index_type(dims)
    sql = (
        f"WITH i AS MATERIALIZED (SELECT id, embedding <=> %s::vector AS d FROM knowledge_chunk "
        # (The scope as no b-tree index can serve it: see _INDEX_LEG.)
        f"WHERE dimensions = {dims} AND NOT index_pending AND ({scope}) IS TRUE "
        f"ORDER BY embedding::{kind}({dims}) <=> %s::{kind}({dims}) LIMIT %s), "
        # Rows the background indexer has not reached yet (chunk_kb_index_pending).
        "p AS MATERIALIZED (SELECT id, embedding <=> %s::vector AS d FROM knowledge_chunk "
        f"WHERE index_pending AND {scope} ORDER BY d LIMIT %s) "
        "SELECT id, d, true FROM i UNION ALL SELECT id, d, false FROM p"
    )
    rows, _ = _with_local_settings(
        _index_settings(dims, limit), sql, [vec, *params, vec, limit, vec, *params, limit]
    )
    from_index = sum(1 for row in rows if row[2])
    ranked = sorted(((row[0], float(row[1])) for row in rows), key=lambda r: (r[1], r[0]))
    return ranked[:limit], from_index


def _index_settings(dims: int, limit: int) -> list[tuple[str, object]]:
    """The settings of an HNSW scan wanting ``limit`` rows."""
    local: list[tuple[str, object]] = [("hnsw.ef_search", ef_search_for(dims, limit))]
    if _iterative_scan_available():
        local += [
            ("hnsw.iterative_scan", settings.SEARCH_ITERATIVE_SCAN),
            ("hnsw.max_scan_tuples", settings.SEARCH_MAX_SCAN_TUPLES),
        ]
    return local


def _with_local_settings(
    local: list[tuple[str, object]], sql: str, params: list[Any]
) -> tuple[list[tuple[Any, ...]], list[str]]:
    """(rows, column names) of ``sql`` run with ``local`` settings for its transaction only
    (``SET LOCAL``), in one round trip: the settings and the statement are sent as one
    query string, which runs in one transaction (an implicit one, or the caller's).
    BEGIN and COMMIT of a transaction of our own were two more round trips, each a wait
    for the server to be scheduled on a loaded machine. One statement at a time, in a
    transaction, where the cursor binds on the server."""
    setting_sql = "SELECT " + ", ".join("set_config(%s, %s, true)" for _ in local)
    setting_params = [str(v) for pair in local for v in pair]
    with connection.cursor() as cur:
        if isinstance(cur.cursor, psycopg.ClientCursor):
            cur.execute(setting_sql + "; " + sql, [*setting_params, *params])
            cur.nextset()
        else:
            with transaction.atomic():
                cur.execute(setting_sql, setting_params)
                cur.execute(sql, params)
        names = [c.name for c in cur.description or ()]
        return cur.fetchall(), names


EF_SCALE_ROWS = 100_000  # SEARCH_EF_SEARCH is the value for an index of this size
# Planner row counts (``pg_class.reltuples``) by relation name: (rows, when read).
_index_rows_cache: dict[str, tuple[float, float]] = {}


def _reltuples(relname: str) -> float:
    """Rows of the table or index ``relname`` (planner statistics), cached for 5 minutes."""
    now = time.monotonic()
    cached = _index_rows_cache.get(relname)
    if cached is not None and now - cached[1] < 300:
        return cached[0]
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [relname])
        row = cur.fetchone()
    rows = max(float(row[0]), 0.0) if row else 0.0
    _index_rows_cache[relname] = (rows, now)
    return rows


def _index_rows(dims: int) -> float:
    """Rows in the HNSW index of ``dims``."""
    return _reltuples(_index_name(dims))


def ef_search_for(dims: int, limit: int) -> int:
    """hnsw.ef_search for an index scan wanting ``limit`` rows.

    SEARCH_EF_SEARCH holds up to 100,000 indexed rows; beyond that it grows with
    log10 of the index size (x2 at 1M: recall@10 0.93 -> 0.98 on the benchmark),
    as a search's path through the graph does. Always at least 2 x ``limit``.
    """
    ef = settings.SEARCH_EF_SEARCH
    if settings.SEARCH_EF_SEARCH_SCALE:
        rows = _index_rows(dims)
        if rows > EF_SCALE_ROWS:
            ef = round(ef * (1 + math.log10(rows / EF_SCALE_ROWS)))
    return min(max(ef, limit * 2), 1000)


def _scope_is_small(scope: str, params: list[Any]) -> bool:
    limit = settings.SEARCH_EXACT_MAX_ROWS
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM knowledge_chunk WHERE {scope} LIMIT %s) s",
            [*params, limit + 1],
        )
        return cur.fetchone()[0] <= limit


def _unfiltered(request: SearchRequest) -> bool:
    return not any(k in request.filters for k in FILTER_KEYS) and (
        request.since is None and request.until is None
    )


def vector_ranking(
    kb_ids: list[str],
    dims: int,
    vector: np.ndarray,
    request: SearchRequest,
    limit: int,
    scope_rows: int | None = None,
) -> list[tuple[int, float]]:
    """[(chunk id, cosine distance)] nearest first: min(limit, matching rows) of them.

    ``scope_rows``: the scope's size when known without counting (the bases'
    chunk counters, for a search without filters).
    """
    scope, params = _scope_sql(kb_ids, request)
    vec = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    max_distance = (
        None if request.similarity_threshold is None else 1.0 - request.similarity_threshold
    )
    if scope_rows is not None:
        small = scope_rows <= settings.SEARCH_EXACT_MAX_ROWS
    else:
        small = _scope_is_small(scope, params)
    if dims in INDEXED_DIMENSIONS and not small:
        rows, from_index = _index_vector(scope, params, vec, dims, limit)
        # The index scan coming back short means the post-filter ate it: redo exactly.
        if from_index >= limit:
            if max_distance is not None:
                rows = [r for r in rows if r[1] <= max_distance]
            return rows
    return _exact_vector(scope, params, vec, limit, max_distance)


def keyword_ranking(
    kb_ids: list[str],
    language: str,
    text: str,
    request: SearchRequest,
    limit: int,
    scope_rows: int | None = None,
) -> list[tuple[int, float]]:
    """[(chunk id, BM25 score)] best first, for the chunks holding any query lexeme.

    ``scope_rows``: the bases' size when known (their chunk counters).
    """
    scope, params = _scope_sql(kb_ids, request)
    filtered = not _unfiltered(request)
    session = _session_of(request)
    return bm25_ranking(kb_ids, language, text, scope, params, limit, filtered, scope_rows, session)


def _session_of(request: SearchRequest) -> str | None:
    """The session a search is filtered to, if it is."""
    session = request.filters.get("session_id")
    return None if session is None else str(session)


def _query_vectors(
    bases: list[KnowledgeBase], request: SearchRequest
) -> dict[tuple[str, str, int], tuple[list[KnowledgeBase], np.ndarray]]:
    groups: dict[tuple[str, str, int], list[KnowledgeBase]] = defaultdict(list)
    for kb in bases:
        groups[(kb.embedding_provider, kb.embedding_model, kb.embedding_dimensions)].append(kb)
    out = {}
    for key, members in groups.items():
        if request.vector is not None:
            vector = np.asarray(request.vector, dtype=np.float32)
            if vector.shape != (key[2],):
                raise SearchError(
                    f"vector has {vector.shape[0]} dimensions; knowledge base "
                    f"{members[0].name!r} uses {key[2]}"
                )
        else:
            vector = kb_embedder(members[0]).embed([request.query or ""])[0]
        out[key] = (members, vector)
    return out


def _decay(hits: list[Hit], created: dict[int, datetime], half_life_days: float) -> None:
    now = timezone.now()
    for hit in hits:
        hit.score *= decay(created[hit.chunk_id], half_life_days, now=now)


def search_chunks(*, bases: list[KnowledgeBase], request: SearchRequest) -> list[Hit]:
    """Rank chunks of ``bases`` for ``request``; returns at most ``top_k`` hits."""
    if request.mode not in MODES:
        raise SearchError(f"mode must be one of {', '.join(MODES)}")
    if request.mode == "keyword" and not request.query:
        raise SearchError("keyword search needs a text query")
    if not bases:
        return []
    one = _one_statement_sql(bases, request)
    if one is not None:
        return _hybrid_in_one_statement(one, request)
    top_k = request.top_k
    pool = top_k if request.mode != "hybrid" else max(top_k * 3, settings.SEARCH_CANDIDATES)

    def vector_leg() -> list[tuple[int, float]]:
        hits: list[tuple[int, float]] = []
        for key, (members, vector) in _query_vectors(bases, request).items():
            known = sum(kb.chunk_count for kb in members) if _unfiltered(request) else None
            kb_ids = [str(kb.pk) for kb in members]
            hits += vector_ranking(kb_ids, key[2], vector, request, pool, scope_rows=known)
        return sorted(hits, key=lambda r: (r[1], r[0]))

    def keyword_leg() -> list[tuple[int, float]]:
        by_language: dict[str, list[KnowledgeBase]] = defaultdict(list)
        for kb in bases:
            by_language[kb.language].append(kb)
        hits: list[tuple[int, float]] = []
        for language, members in by_language.items():
            kb_ids = [str(kb.pk) for kb in members]
            rows = sum(kb.chunk_count for kb in members)
            hits += keyword_ranking(kb_ids, language, request.query or "", request, pool, rows)
        return sorted(hits, key=lambda r: (-r[1], r[0]))

    want_vector = request.mode in ("vector", "hybrid")
    want_keyword = request.mode in ("keyword", "hybrid") and bool(request.query)
    if want_vector and want_keyword:
        vector_hits, keyword_hits = _both(vector_leg, keyword_leg)
    else:
        vector_hits = vector_leg() if want_vector else []
        keyword_hits = keyword_leg() if want_keyword else []
    hits = _fuse(vector_hits, keyword_hits, request)
    if request.mode == "hybrid" and settings.SEARCH_CONTEXT_WEIGHT > 0 and hits:
        return _finish_with_context(hits, request, [str(kb.pk) for kb in bases])
    return _finish(hits, request)


_legs_executor: ThreadPoolExecutor | None = None
_legs_executor_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _legs_executor
    with _legs_executor_lock:
        if _legs_executor is None:
            _legs_executor = ThreadPoolExecutor(
                max_workers=settings.SEARCH_PARALLEL_WORKERS, thread_name_prefix="search-leg"
            )
        return _legs_executor


def _forget_executor() -> None:
    # A forked child (gunicorn/qcluster workers) inherits the pool but not its threads.
    global _legs_executor, _legs_executor_lock
    _legs_executor, _legs_executor_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_executor)


def _on_own_connection(fn: Callable[[], T]) -> T:
    try:
        return fn()
    finally:
        # What a request's end does: drop the connection if CONN_MAX_AGE says so or
        # it broke, keep it for the next search otherwise.
        close_old_connections()


def _both(first: Callable[[], T], second: Callable[[], U]) -> tuple[T, U]:
    """Run ``first`` here and ``second`` on a pool thread (its own connection) at once.

    Inside a transaction both run here, in order: another connection would not
    see the transaction's uncommitted writes.
    """
    if not settings.SEARCH_PARALLEL_LEGS or connection.in_atomic_block:
        return first(), second()
    future = _executor().submit(_on_own_connection, second)
    try:
        a = first()
    except BaseException:
        future.cancel()
        raise
    return a, future.result()


def _fuse(
    vector_hits: list[tuple[int, float]],
    keyword_hits: list[tuple[int, float]],
    request: SearchRequest,
) -> list[Hit]:
    """One Hit per candidate, scored as knowledge.fusion describes for hybrid searches."""
    by_id: dict[int, Hit] = {}

    def hit(chunk_id: int) -> Hit:
        return by_id.setdefault(chunk_id, Hit(chunk_id=chunk_id, knowledge_base_id="", score=0.0))

    for rank, (chunk_id, distance) in enumerate(vector_hits, start=1):
        hit(chunk_id).vector_rank, hit(chunk_id).vector_score = rank, 1.0 - distance
    for rank, (chunk_id, keyword_score) in enumerate(keyword_hits, start=1):
        hit(chunk_id).keyword_rank, hit(chunk_id).keyword_score = rank, keyword_score
    if request.mode != "hybrid":
        for h in by_id.values():
            h.score = (h.vector_score if request.mode == "vector" else h.keyword_score) or 0.0
        return list(by_id.values())
    similarities = [(cid, 1.0 - distance) for cid, distance in vector_hits]
    if request.rrf_k is not None or settings.SEARCH_FUSION == "rrf":
        scores = fusion.rrf_scores(
            similarities, keyword_hits, request.rrf_k or settings.SEARCH_RRF_K
        )
    else:
        scores = fusion.weighted_scores(similarities, keyword_hits, settings.SEARCH_VECTOR_WEIGHT)
    for chunk_id, score in scores.items():
        hit(chunk_id).score = score
    return list(by_id.values())


_DETAIL_COLUMNS = (
    "id, knowledge_base_id, text, source_key, document_key, chunk_index, chunk_total, "
    "source_type, message_id, session_id, flow_id, run_id, sender, file_path, content_hash, "
    "source_timestamp, metadata, created_at"
)
_DETAIL_SQL = f"SELECT {_DETAIL_COLUMNS} FROM knowledge_chunk WHERE id = ANY(%s)"
# Context and the final choice in one statement (``knowledge.fusion.with_context``, in
# SQL): the fused candidates come in as arrays; the best of them (the donors) read their
# neighbours, ids only, from the chunk_kb_session_order index; each candidate or neighbour
# gets its score plus weight ** d x the best donor score d steps away; a neighbour that is
# not a candidate must be in the search's scope ({neighbour_in_scope}); and only the best
# ``limit`` of them (all for NULL) are read in full. So a hybrid search with context
# costs the statements the old one did: its two legs, then one read of the top k.
# ``{cand}``: the candidates' CTEs, ending in ``cand (id, score, vrank, krank, vscore,
# kscore)``: the fused score, each leg's rank and score (NULL outside it).
_CONTEXT_SQL = f"""
WITH {{cand}},
donor AS MATERIALIZED (SELECT id, score FROM cand ORDER BY score DESC, id LIMIT %s),
nb AS MATERIALIZED (
    SELECT d.score,
        ARRAY(SELECT p.id FROM knowledge_chunk p
               WHERE p.knowledge_base_id = c.knowledge_base_id AND p.session_id = c.session_id
                 AND (p.source_timestamp, p.id) < (c.source_timestamp, c.id)
               ORDER BY p.source_timestamp DESC, p.id DESC LIMIT %s) AS before,
        ARRAY(SELECT n.id FROM knowledge_chunk n
               WHERE n.knowledge_base_id = c.knowledge_base_id AND n.session_id = c.session_id
                 AND (n.source_timestamp, n.id) > (c.source_timestamp, c.id)
               ORDER BY n.source_timestamp, n.id LIMIT %s) AS after
    FROM donor d JOIN knowledge_chunk c ON c.id = d.id
),
best AS (
    SELECT u.id, u.dist, max(nb.score) AS score
    FROM nb CROSS JOIN LATERAL (
        SELECT * FROM unnest(nb.before) WITH ORDINALITY AS b(id, dist)
        UNION ALL
        SELECT * FROM unnest(nb.after) WITH ORDINALITY AS a(id, dist)
    ) u
    GROUP BY u.id, u.dist
),
bonus AS (SELECT id, sum(power(%s::float8, dist) * score) AS bonus FROM best GROUP BY id),
ranked AS (
    SELECT coalesce(c.id, x.id) AS id, coalesce(c.score, 0) + coalesce(x.bonus, 0) AS score,
           c.vrank, c.krank, c.vscore, c.kscore, c.id IS NOT NULL AS candidate
    FROM cand c FULL JOIN bonus x ON x.id = c.id
),
top AS (
    SELECT r.id, r.score, r.vrank, r.krank, r.vscore, r.kscore FROM ranked r
    WHERE r.candidate OR {{neighbour_in_scope}}
    ORDER BY r.score DESC, coalesce(r.vrank, 1000000000), coalesce(r.krank, 1000000000), r.id
    LIMIT %s
)
SELECT {", ".join("k." + col for col in _DETAIL_COLUMNS.split(", "))}, top.score AS context_score,
       top.vrank, top.krank, top.vscore, top.kscore
FROM top JOIN knowledge_chunk k ON k.id = top.id
"""
# The candidates of a search whose legs ran apart, fused in Python (``_fuse``).
_GIVEN_CANDIDATES = """cand AS (
    SELECT t.*, NULL::float8 AS vscore, NULL::float8 AS kscore
    FROM unnest(%s::bigint[], %s::float8[], %s::int[], %s::int[]) AS t(id, score, vrank, krank)
)"""
_LEG_COLUMNS = ("vrank", "krank", "vscore", "kscore")
# Filters a neighbour need not share with its donor (it shares base and session).
_NEIGHBOUR_FILTERS = tuple(key for key in FILTER_KEYS if key != "session_id")


def _neighbour_check(request: SearchRequest, kb_ids: list[str]) -> tuple[str, list[Any]]:
    """The condition a neighbour that is not a candidate must meet to be a hit (row ``r``):
    the search's filters other than its session, which it shares with its donor."""
    filtered = any(k in request.filters for k in _NEIGHBOUR_FILTERS) or (
        request.since is not None or request.until is not None
    )
    if not filtered:
        return "true", []
    scope, params = _scope_sql(kb_ids, request, alias="k.")
    return f"EXISTS (SELECT 1 FROM knowledge_chunk k WHERE k.id = r.id AND {scope})", params


def _finish_with_context(hits: list[Hit], request: SearchRequest, kb_ids: list[str]) -> list[Hit]:
    """The top_k hits once the neighbours' context is added (``_CONTEXT_SQL``)."""
    check, params = _neighbour_check(request, kb_ids)
    window = settings.SEARCH_CONTEXT_WINDOW
    rows = _detail_rows(
        *prepared.fetch(
            _CONTEXT_SQL.format(cand=_GIVEN_CANDIDATES, neighbour_in_scope=check),
            [
                [h.chunk_id for h in hits],
                [h.score for h in hits],
                [h.vector_rank for h in hits],
                [h.keyword_rank for h in hits],
                fusion.CONTEXT_DONORS * request.top_k,
                window,
                window,
                float(settings.SEARCH_CONTEXT_WEIGHT),
                *params,
                # Decay reorders by age: every candidate is needed then.
                None if request.half_life_days else request.top_k,
            ],
        )
    )
    by_id = {h.chunk_id: h for h in hits}
    for chunk_id, row in rows.items():
        hit = by_id.setdefault(chunk_id, Hit(chunk_id=chunk_id, knowledge_base_id="", score=0.0))
        hit.score = float(row.pop("context_score"))
        for name in _LEG_COLUMNS:
            row.pop(name)
    return _finish([by_id[cid] for cid in rows], request, rows)


# A hybrid search in one statement (``_one_statement_sql``): the query vector once (CTE
# ``qv``), the vector leg, the keyword leg (``bm25.one_statement_sql`` as a subquery),
# weighted fusion (``fusion.weighted_scores`` in SQL), then context and the top k's
# details (``_CONTEXT_SQL``). The vector leg, as ``vector_ranking`` runs it:
# - ``e``: an exact scan; after an index scan, only if it came back short;
_EXACT_LEG = """e AS MATERIALIZED (
    SELECT id, embedding <=> (SELECT q FROM qv) AS d FROM knowledge_chunk
    WHERE {scope}{gate} ORDER BY d, id LIMIT %s
)"""
# - ``i``: the HNSW index (ranking by its type, handing back the exact distance), ``p``: the
#   rows the background indexer has not reached; ``{gate}`` skips both for a small scope.
#   ``i``'s scope is written so that no b-tree index serves it: the scope is large here,
#   and a plan made without its values (a generic one) must still take the HNSW index;
_INDEX_LEG = """i AS MATERIALIZED (
    SELECT id, embedding <=> (SELECT q FROM qv) AS d FROM knowledge_chunk
    WHERE dimensions = {dims} AND NOT index_pending AND ({scope}) IS TRUE{gate}
    ORDER BY embedding::{kind}({dims}) <=> (SELECT q::{kind}({dims}) FROM qv) LIMIT %s
),
p AS MATERIALIZED (
    SELECT id, embedding <=> (SELECT q FROM qv) AS d FROM knowledge_chunk
    WHERE index_pending AND {scope}{gate} ORDER BY d LIMIT %s
)"""
# - ``sm``: for a filtered scope, whether it is small enough to scan (``_scope_is_small``);
_SMALL_SCOPE = """sm AS MATERIALIZED (
    SELECT count(*) <= %s AS yes FROM (SELECT 1 FROM knowledge_chunk WHERE {scope} LIMIT %s) s
)"""
# - ``v``: what the vector leg returns (the index's rows if it returned enough, else the
#   exact scan's), cut at the similarity threshold.
_INDEX_OR_EXACT = """v AS (
    SELECT id, d FROM (SELECT id, d FROM i UNION ALL SELECT id, d FROM p) x
    WHERE (SELECT count(*) FROM i) >= %s
    UNION ALL SELECT id, d FROM e
    ORDER BY d, id LIMIT %s
)"""
_FUSED = """vr AS (
    SELECT id, 1.0::float8 - d AS s, (row_number() OVER (ORDER BY d, id))::int AS rank
    FROM v{cut}
),
kr AS (SELECT id, score AS s, (row_number() OVER (ORDER BY score DESC, id))::int AS rank FROM k),
cand AS (
    SELECT coalesce(vr.id, kr.id) AS id,
           %s::float8 * CASE WHEN vr.id IS NULL THEN 0 WHEN vx.hi > vx.lo
                             THEN (vr.s - vx.lo) / (vx.hi - vx.lo) ELSE 1 END
           + %s::float8 * CASE WHEN kr.id IS NULL THEN 0 WHEN kx.hi > kx.lo
                               THEN (kr.s - kx.lo) / (kx.hi - kx.lo) ELSE 1 END AS score,
           vr.rank AS vrank, kr.rank AS krank, vr.s AS vscore, kr.s AS kscore
    FROM vr FULL JOIN kr ON kr.id = vr.id
    CROSS JOIN (SELECT max(s) AS hi, min(s) AS lo FROM vr) vx
    CROSS JOIN (SELECT max(s) AS hi, min(s) AS lo FROM kr) kx
)"""


# The legs of a split search (``SplitLegs``) come back to the statement that fuses them
# as arrays: ``v`` and ``k`` as the one statement's CTEs would hold them.
_GIVEN_LEGS = """v AS (SELECT * FROM unnest(%s::bigint[], %s::float8[]) AS v(id, d)),
k AS (SELECT * FROM unnest(%s::bigint[], %s::float8[]) AS k(id, score))"""


@dataclass(frozen=True)
class SplitLegs:
    """The statement of ``OneStatement`` as three: its vector leg (rows id, distance) and
    its keyword leg (rows id, score), run at once on two connections, then fusion, context
    and details (``_GIVEN_LEGS``: the same SQL over the legs' rows, so the same ranking to
    the bit). Each: SQL, parameters, settings local to it, whether it is prepared."""

    vector: tuple[str, list[Any], list[tuple[str, object]], bool]
    keyword: tuple[str, list[Any], list[tuple[str, object]], bool]
    fuse_sql: str
    fuse_params: list[Any]  # after the legs' four arrays


@dataclass(frozen=True)
class OneStatement:
    """A hybrid search as one statement: its SQL and parameters, the settings local to it
    (HNSW, the plan cache mode) and whether it may be prepared; ``split``: the same search
    as two legs at once, for a scope large enough that running them side by side pays."""

    sql: str
    params: list[Any]
    local: list[tuple[str, object]]
    prepare: bool
    split: SplitLegs | None = None


def _one_statement_sql(bases: list[KnowledgeBase], request: SearchRequest) -> OneStatement | None:
    """The search as one statement, or None when it takes the legs apart: other fusion
    than the default, decay, context off, several embedders or languages, a keyword leg
    that is pruned (``bm25.unpruned``) or a query without words."""
    if (
        request.mode != "hybrid"
        or not settings.SEARCH_ONE_STATEMENT
        or settings.SEARCH_FUSION != "weighted"
        or request.rrf_k is not None
        or request.half_life_days
        or settings.SEARCH_CONTEXT_WEIGHT <= 0
        or not re.search(r"\w", request.query or "")
    ):
        return None
    embedders = {
        (kb.embedding_provider, kb.embedding_model, kb.embedding_dimensions) for kb in bases
    }
    if len(embedders) != 1 or len({kb.language for kb in bases}) != 1:
        return None
    unfiltered = _unfiltered(request)
    rows = sum(kb.chunk_count for kb in bases)
    if not bm25.unpruned(not unfiltered, rows):
        return None
    [(members, vector)] = _query_vectors(bases, request).values()
    dims = members[0].embedding_dimensions
    kb_ids = [str(kb.pk) for kb in bases]
    top_k = request.top_k
    pool = max(top_k * 3, settings.SEARCH_CANDIDATES)
    scope, scope_params = _scope_sql(kb_ids, request)
    # Sent in binary, unless the statement goes through Django's cursor (which binds on
    # the client: a filtered search inside a transaction, see ``prepare`` below).
    binds_on_server = unfiltered or not connection.in_atomic_block
    query_vector: Any = prepared.VectorParam(vector)
    if not binds_on_server:
        query_vector = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    params: list[Any] = [query_vector]
    ctes = ["qv AS (SELECT %s::vector AS q)"]
    local: list[tuple[str, object]] = []
    small = unfiltered and rows <= settings.SEARCH_EXACT_MAX_ROWS
    if dims not in INDEXED_DIMENSIONS or small:
        ctes.append(_EXACT_LEG.format(scope=scope, gate="").replace("e AS", "v AS", 1))
        params += [*scope_params, pool]
    else:
        gate = ""
        if not unfiltered:
            ctes.append(_SMALL_SCOPE.format(scope=scope))
            limit = settings.SEARCH_EXACT_MAX_ROWS
            params += [limit, *scope_params, limit + 1]
            gate = " AND NOT (SELECT yes FROM sm)"
        ctes.append(_INDEX_LEG.format(dims=dims, kind=_index_type(dims), scope=scope, gate=gate))
        params += [*scope_params, pool, *scope_params, pool]
        ctes.append(_EXACT_LEG.format(scope=scope, gate=" AND (SELECT count(*) FROM i) < %s"))
        params += [*scope_params, pool, pool]
        ctes.append(_INDEX_OR_EXACT)
        params += [pool, pool]
        # No parallel plan for the exact scan: its workers would start even when the index
        # scan came back full and the scan is skipped (7 ms on a 31,000-chunk scope).
        local = [*_index_settings(dims, pool), ("max_parallel_workers_per_gather", 0)]
    keyword_sql, keyword_params = bm25.one_statement_sql(
        bases[0].language,
        request.query or "",
        scope,
        scope_params,
        kb_ids,
        pool,
        bm25.scope_tokens(kb_ids, _session_of(request)),
    )
    tail: list[Any] = []
    cut = ""
    if request.similarity_threshold is not None:
        cut = " WHERE d <= %s"
        tail.append(1.0 - request.similarity_threshold)
    weight = float(settings.SEARCH_VECTOR_WEIGHT)
    tail += [weight, 1.0 - weight]
    check, check_params = _neighbour_check(request, kb_ids)
    window = settings.SEARCH_CONTEXT_WINDOW
    tail += [
        fusion.CONTEXT_DONORS * top_k,
        window,
        window,
        float(settings.SEARCH_CONTEXT_WEIGHT),
        *check_params,
        top_k,
    ]
    sql = _CONTEXT_SQL.format(
        cand=",\n".join([*ctes, f"k AS MATERIALIZED ({keyword_sql})", _FUSED.format(cut=cut)]),
        neighbour_in_scope=check,
    )
    # Prepared: parsed once per connection (the vector goes as a parameter, not as text
    # to parse: 5.5 -> 3.9 ms for a filtered scope of 1,500 chunks), with a generic plan
    # (planning this statement cost more than running it on a small base: 1.2 ms). Safe
    # for any values, filtered or not, because no CTE's plan depends on them: the index
    # CTE takes the HNSW index and the keyword matches the scoped text index, each with a
    # scope no b-tree index can serve; the exact scan and the count take the scope's.
    # Inside a transaction the setting would outlast the statement: there an unfiltered
    # one is planned as PostgreSQL chooses, a filtered one is not prepared.
    plan: list[tuple[str, object]] = []
    if not connection.in_atomic_block:
        plan = [("plan_cache_mode", "force_generic_plan")]
    prepare = binds_on_server
    kind = "small scope" if small else "index" if unfiltered else "filtered"
    split = None
    if (
        rows >= settings.SEARCH_SPLIT_MIN_ROWS
        and settings.SEARCH_PARALLEL_LEGS
        and not connection.in_atomic_block
    ):
        vector_sql = f"/* vector leg, {kind} */WITH " + ",\n".join(ctes)
        vector_sql += " SELECT id, d FROM v ORDER BY d, id"
        fuse_sql = _CONTEXT_SQL.format(
            cand=",\n".join([_GIVEN_LEGS, _FUSED.format(cut=cut)]), neighbour_in_scope=check
        )
        split = SplitLegs(
            # Generic plans, as the one statement's (above).
            vector=(vector_sql, params, [*local, *plan], True),
            keyword=(f"/* keyword leg, {kind} */" + keyword_sql, keyword_params, plan, True),
            fuse_sql="/* fused legs */" + fuse_sql,
            fuse_params=tail,
        )
    return OneStatement(
        f"/* hybrid, {kind} */" + sql,
        params + keyword_params + tail,
        [*local, *plan],
        prepare,
        split,
    )


def _hybrid_in_one_statement(statement: OneStatement, request: SearchRequest) -> list[Hit]:
    """Run ``statement`` in one round trip: prepared if it may be, else with its HNSW
    settings local to its transaction, sent in the same query string. A split statement
    runs its legs at once on two connections, then fuses them (``SplitLegs``)."""
    if statement.split is not None:
        legs = statement.split

        def run(leg: tuple[str, list[Any], list[tuple[str, object]], bool]) -> list[tuple]:
            sql, params, local, prepare = leg
            return prepared.fetch(sql, params, prepare=prepare, local=local or None)[0]

        vector_rows, keyword_rows = _both(lambda: run(legs.vector), lambda: run(legs.keyword))
        # As array literals: psycopg's list adapter cost 0.17 ms for these four. (A float's
        # repr reads back as the same float8.)
        arrays = [
            "{" + ",".join(str(row[0]) for row in vector_rows) + "}",
            "{" + ",".join(repr(row[1]) for row in vector_rows) + "}",
            "{" + ",".join(str(row[0]) for row in keyword_rows) + "}",
            "{" + ",".join(repr(row[1]) for row in keyword_rows) + "}",
        ]
        # Planned as PostgreSQL chooses (a generic plan after a few runs: its shape does not
        # depend on the values); no setting to send saves a statement in the round trip.
        rows, names = prepared.fetch(legs.fuse_sql, [*arrays, *legs.fuse_params])
    elif statement.prepare or not statement.local:
        rows, names = prepared.fetch(
            statement.sql, statement.params, prepare=statement.prepare, local=statement.local
        )
    else:
        rows, names = _with_local_settings(statement.local, statement.sql, statement.params)
    details = _detail_rows(rows, names)
    hits = []
    for chunk_id, row in details.items():
        vrank, krank, vscore, kscore = (row.pop(name) for name in _LEG_COLUMNS)
        hits.append(
            Hit(
                chunk_id=chunk_id,
                knowledge_base_id="",
                score=float(row.pop("context_score")),
                vector_score=None if vscore is None else float(vscore),
                vector_rank=vrank,
                keyword_score=None if kscore is None else float(kscore),
                keyword_rank=krank,
            )
        )
    return _finish(hits, request, details)


def _finish(
    hits: list[Hit], request: SearchRequest, rows: dict[int, dict[str, Any]] | None = None
) -> list[Hit]:
    """The top_k hits, best first, with their text and metadata (``rows``: details
    already read for every hit that can be among them)."""
    if not hits:
        return []

    def order(h: Hit) -> tuple:
        return (-h.score, h.vector_rank or 10**9, h.keyword_rank or 10**9, h.chunk_id)

    if request.half_life_days:
        # Decay reorders by age: every candidate's timestamp is needed first.
        if rows is None:
            rows = _details([h.chunk_id for h in hits])
        created = {cid: row["timestamp"] or row["created_at"] for cid, row in rows.items()}
        hits = [h for h in hits if h.chunk_id in rows]
        _decay(hits, created, request.half_life_days)
        hits = sorted(hits, key=order)[: request.top_k]
    else:
        hits = sorted(hits, key=order)[: request.top_k]
        rows = rows or {}
        missing = [h.chunk_id for h in hits if h.chunk_id not in rows]
        if missing:
            rows = {**rows, **_details(missing)}
    out = []
    for hit in hits:
        row = rows.get(hit.chunk_id)
        if row is None:  # deleted between ranking and this read
            continue
        hit.knowledge_base_id = str(row.pop("knowledge_base_id"))
        hit.text = row.pop("text")
        row.pop("created_at")
        extra = row.pop("metadata") or {}
        timestamp = row.pop("timestamp")
        hit.metadata = {**extra, **row, "timestamp": timestamp.isoformat() if timestamp else None}
        out.append(hit)
    return out


def _details(ids: list[int]) -> dict[int, dict[str, Any]]:
    return _detail_rows(*prepared.fetch(_DETAIL_SQL, [ids]))


def _detail_rows(rows: list[tuple[Any, ...]], names: list[str]) -> dict[int, dict[str, Any]]:
    out = {}
    for values in rows:
        row = dict(zip(names, values))
        row["timestamp"] = row.pop("source_timestamp")
        if isinstance(row["metadata"], str):  # Django's connection loads jsonb as text
            row["metadata"] = json.loads(row["metadata"])
        out[row.pop("id")] = row
    return out
