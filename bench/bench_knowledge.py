"""Knowledge retrieval and ingestion benchmark (service-side, no HTTP).

Run from the repository root, against a private database:

    EMBEDDED_DB_NAME=bench EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_knowledge.py --chunks 100000 [--queries 200] [--fresh]

(both variables default to those values here, so the bench never writes into the
development database by accident). Migrations are applied to that database if
needed. Nothing is written to files; the figures are printed.

Data: ``--chunks`` one-chunk documents over 100 tenants (Django users) with a
realistic skew: tenant 0 owns one base with 30% of all chunks plus two small
bases; tenants 1-6 own 2, 3, 4, 5, 6 and 8% (two bases each); tenants 7-99 share
the remaining 40% (0.1-0.8% each, one base). Vectors are 384-dimension, clustered:
200 gaussian centres on the unit sphere, point = centre + isotropic noise (norm
~``--noise``), normalised; each tenant draws 80% of its rows from 20 "home" clusters. Text is
2 synthetic sentences from the cluster's own words plus common words, so keyword
search has signal. Metadata: 20 sessions per tenant, a timestamp in 2025.

Reported:

* ingestion: ``knowledge_base_ingest`` with the base's embedder replaced by one
  returning precomputed vectors (embedding cost ~0), batches of ``--batch``
  documents: the write path (chunking, staging, binary COPY, upsert with HNSW + GIN
  + btree maintenance, counters). A rebuild (``--fresh``, or no matching data) times
  the whole load; with ``--bulk-load`` the HNSW index is dropped for the load and
  rebuilt afterwards (insert-then-build; the build is timed too). Unless
  ``--skip-probes``, every run also ingests ``--probe-chunks`` chunks into a
  384-dimension probe base (HNSW maintained, at full table size) and into a
  383-dimension one (same write path, outside the partial HNSW index: the cost
  without HNSW maintenance); the probes are deleted and the table vacuumed after.
  The hashing embedder's own rate is measured separately.
* retrieval, per scenario: hybrid top-10 latency p50/p99 around
  ``knowledge.search.search_chunks``; vector-mode recall@10 against numpy brute
  force over the scope's vectors (fetched once); rows returned (min/median, must
  be min(10, matching rows)); which path the vector ranking took; where the hybrid
  time goes inside search.py. Queries are noisy copies (noise norm
  ``--query-noise``) of cluster centres (80% from the tenant's home clusters) with
  three of the cluster's words as text.

``--tune`` also measures alternatives for the constants that decide the path (the chunks'
``exact_max``, ``hnsw.MAX_SCAN_TUPLES`` and ``hnsw.EF_SEARCH``) and the split legs.
``--paired-copies`` times each scenario's hybrid search with the chunks' collection as it
is and without its 16-bit copies (``without_copies``), query by query in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# One BLAS thread: idle OpenBLAS threads spin and would steal a core from PostgreSQL.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import psycopg  # noqa: E402

sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDED_DB_NAME", "bench")
os.environ.setdefault("EMBEDDING_PROVIDER", "hashing")

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import override_settings  # noqa: E402

from core.db_backend.base import table_owner  # noqa: E402
from core.providers.embeddings import HashingEmbedder, _feature_slot  # noqa: E402
from knowledge import search  # noqa: E402
from knowledge.models import Chunk, KnowledgeBase  # noqa: E402
from knowledge.retrieval import bm25, hnsw  # noqa: E402
from knowledge.search import SearchRequest, search_chunks  # noqa: E402
from knowledge.services import (  # noqa: E402
    DocumentIn,
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_delete_chunks,
    knowledge_base_ingest,
    knowledge_index_pending,
)
from knowledge.services import ingest as services  # noqa: E402

DIMS = 384
N_TENANTS = 100
N_CLUSTERS = 200
HOME_CLUSTERS = 20
HOME_SHARE = 0.8
SESSIONS_PER_TENANT = 20
DATA_VERSION = 2
USER_PREFIX = "bench-t"
PROBE_USER = "bench-probe"
T_START = datetime(2025, 1, 1, tzinfo=UTC)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- synthetic data -------------------------------------------------------------------
@dataclass
class BaseSpec:
    tenant: int
    name: str
    rows: int
    role: str  # large / large-extra / mid / small


MID_SHARES = (0.02, 0.03, 0.04, 0.05, 0.06, 0.08)  # tenants 1-6


def plan_bases(total: int, seed: int) -> list[BaseSpec]:
    """Bases of the 100 tenants, sizes summing exactly to ``total``."""
    rng = np.random.default_rng(seed + 1)
    specs = [
        BaseSpec(0, "big", round(0.30 * total), "large"),
        BaseSpec(0, "notes", round(0.005 * total), "large-extra"),
        BaseSpec(0, "files", round(0.005 * total), "large-extra"),
    ]
    for tenant, share in enumerate(MID_SHARES, start=1):
        rows = round(share * total)
        specs.append(BaseSpec(tenant, "main", rows - rows // 3, "mid"))
        specs.append(BaseSpec(tenant, "archive", rows // 3, "mid"))
    first_small = len(MID_SHARES) + 1
    rest = total - sum(s.rows for s in specs)
    weights = rng.uniform(0.1, 1.0, N_TENANTS - first_small)
    sizes = np.maximum(1, np.floor(weights / weights.sum() * rest)).astype(int)
    sizes[np.argmax(sizes)] += rest - int(sizes.sum())
    specs += [BaseSpec(first_small + i, "main", int(n), "small") for i, n in enumerate(sizes)]
    assert sum(s.rows for s in specs) == total and all(s.rows > 0 for s in specs)
    return specs


_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aou"]
_FILLERS = "the a and with for about of to in on we they it this that was is".split()


class Corpus:
    """Cluster centres, their vocabularies and the per-tenant home clusters."""

    def __init__(self, seed: int, noise: float):
        rng = np.random.default_rng(seed)
        centres = rng.standard_normal((N_CLUSTERS, DIMS))
        self.centres = centres / np.linalg.norm(centres, axis=1, keepdims=True)
        self.sigma = noise / np.sqrt(DIMS)
        words: list[str] = []
        seen: set[str] = set()
        wrng = random.Random(seed)
        while len(words) < N_CLUSTERS * 6 + 300:
            word = "".join(wrng.choice(_SYLLABLES) for _ in range(3))
            if word not in seen:
                seen.add(word)
                words.append(word)
        self.cluster_words = [words[i * 6 : i * 6 + 6] for i in range(N_CLUSTERS)]
        self.common_words = words[N_CLUSTERS * 6 :]
        self.home = [rng.choice(N_CLUSTERS, HOME_CLUSTERS, replace=False) for _ in range(N_TENANTS)]

    def clusters_for(self, tenant: int, n: int, rng: np.random.Generator) -> np.ndarray:
        home = self.home[tenant][rng.integers(0, HOME_CLUSTERS, n)]
        anywhere = rng.integers(0, N_CLUSTERS, n)
        return np.where(rng.random(n) < HOME_SHARE, home, anywhere)

    def vectors(self, clusters: np.ndarray, rng: np.random.Generator, sigma=None) -> np.ndarray:
        sigma = self.sigma if sigma is None else sigma
        points = self.centres[clusters] + sigma * rng.standard_normal((len(clusters), DIMS))
        return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)

    def sentence(self, cluster: int, rng: random.Random) -> str:
        words = rng.choices(self.cluster_words[cluster], k=4)
        words += rng.choices(self.common_words, k=7) + rng.choices(_FILLERS, k=4)
        rng.shuffle(words)
        return " ".join(words).capitalize() + "."

    def text(self, cluster: int, rng: random.Random) -> str:
        return f"{self.sentence(cluster, rng)} {self.sentence(cluster, rng)}"


def make_documents(
    corpus: Corpus, spec: BaseSpec, start: int, n: int, seed: int
) -> tuple[list[DocumentIn], np.ndarray]:
    """Documents ``start .. start + n`` of a base, deterministic for (seed, base, start)."""
    key = (seed, spec.tenant, sum(map(ord, spec.name)), start)
    rng = np.random.default_rng(key)
    trng = random.Random(hash(key))
    clusters = corpus.clusters_for(spec.tenant, n, rng)
    vectors = corpus.vectors(clusters, rng)
    sessions = rng.integers(0, SESSIONS_PER_TENANT, n)
    seconds = rng.integers(0, 365 * 86400, n)
    docs = [
        DocumentIn.from_payload(
            source_key=f"d{start + i}",
            text=corpus.text(int(clusters[i]), trng),
            metadata={
                "session_id": f"t{spec.tenant:03d}-s{int(sessions[i]):02d}",
                "source_type": "message",
                "timestamp": (T_START + timedelta(seconds=int(seconds[i]))).isoformat(),
            },
        )
        for i in range(n)
    ]
    return docs, vectors


# --- ingestion ------------------------------------------------------------------------
class PrecomputedEmbedder:
    """Stands in for the base's embedder: hands out the batch's prepared vectors."""

    provider, model = "hashing", "precomputed"

    def __init__(self, dimensions: int):
        self.dimensions = dimensions
        self.vectors = np.zeros((0, dimensions), dtype=np.float32)
        self.pos = 0
        self.seconds = 0.0

    def load(self, vectors: np.ndarray) -> None:
        self.vectors, self.pos = vectors, 0

    def embed(self, texts: list[str]) -> np.ndarray:
        t0 = time.perf_counter()
        out = self.vectors[self.pos : self.pos + len(texts)]
        self.pos += len(texts)
        assert len(out) == len(texts), "one chunk per document expected"
        self.seconds += time.perf_counter() - t0
        return out


@contextlib.contextmanager
def precomputed_embedder(dimensions: int) -> Iterator[PrecomputedEmbedder]:
    fake = PrecomputedEmbedder(dimensions)
    original = services.kb_embedder
    services.kb_embedder = lambda kb: fake
    try:
        yield fake
    finally:
        services.kb_embedder = original


@dataclass
class LoadStats:
    chunks: int = 0
    seconds: float = 0.0
    batch_seconds: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0

    def tail_rate(self, fraction: float = 0.1) -> float:
        k = max(1, round(len(self.batch_seconds) * fraction))
        return sum(self.batch_sizes[-k:]) / sum(self.batch_seconds[-k:])


def ingest_base(
    kb: KnowledgeBase,
    spec: BaseSpec,
    corpus: Corpus,
    seed: int,
    batch: int,
    fake: PrecomputedEmbedder,
    stats: LoadStats,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
) -> None:
    for start in range(0, spec.rows, batch):
        n = min(batch, spec.rows - start)
        docs, vectors = make_documents(corpus, spec, start, n, seed)
        fake.load(transform(vectors) if transform else vectors)
        embed_before = fake.seconds
        t0 = time.perf_counter()
        result = knowledge_base_ingest(knowledge_base=kb, documents=docs)
        elapsed = time.perf_counter() - t0 - (fake.seconds - embed_before)
        assert result.chunks_written == n, (result, n)
        stats.chunks += n
        stats.seconds += elapsed
        stats.batch_seconds.append(elapsed)
        stats.batch_sizes.append(n)


def _marker(total: int, seed: int, noise: float) -> str:
    return f"bench-knowledge v{DATA_VERSION} chunks={total} seed={seed} noise={noise}"


def bench_bases() -> list[KnowledgeBase]:
    return list(
        KnowledgeBase.objects.filter(owner__username__startswith=USER_PREFIX)
        .select_related("owner")
        .order_by("owner__username", "name")
    )


def existing_data_matches(specs: list[BaseSpec], marker: str) -> bool:
    bases = bench_bases()
    if len(bases) != len(specs) or any(kb.description != marker for kb in bases):
        return False
    have = {(kb.owner.username, kb.name): kb.chunk_count for kb in bases}
    return all(have.get((f"{USER_PREFIX}{s.tenant:03d}", s.name)) == s.rows for s in specs)


def drop_bench_data() -> None:
    users = get_user_model().objects.filter(username__startswith=USER_PREFIX)
    only_bench = not KnowledgeBase.objects.exclude(owner__username__startswith=USER_PREFIX).exists()
    if only_bench:
        # The chunk table holds nothing else: TRUNCATE also empties the indexes (as the
        # tables' owner: the service's role may not truncate).
        with table_owner(connection), connection.cursor() as cur:
            cur.execute("TRUNCATE knowledge_chunk")
    users.delete()


def load_dataset(
    specs: list[BaseSpec], corpus: Corpus, seed: int, batch: int, marker: str
) -> LoadStats:
    User = get_user_model()
    stats = LoadStats()
    done = 0
    next_report = 0.1
    with precomputed_embedder(DIMS) as fake:
        for spec in specs:
            user, _ = User.objects.get_or_create(username=f"{USER_PREFIX}{spec.tenant:03d}")
            kb = knowledge_base_create(owner=user, name=spec.name, description=marker)
            ingest_base(kb, spec, corpus, seed, batch, fake, stats)
            done += spec.rows
            if done / sum(s.rows for s in specs) >= next_report:
                log(
                    f"  loaded {done:,} chunks, {stats.rate:,.0f} chunks/s so far "
                    f"(last batch {stats.batch_sizes[-1] / stats.batch_seconds[-1]:,.0f}/s)"
                )
                while done / sum(s.rows for s in specs) >= next_report:
                    next_report += 0.1
    return stats


def probe_ingest(
    corpus: Corpus, seed: int, chunks: int, batch: int, dims: int
) -> tuple[LoadStats, KnowledgeBase]:
    """Ingest ``chunks`` into a fresh probe base of ``dims`` dimensions."""
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=PROBE_USER)
    KnowledgeBase.objects.filter(owner=user, name=f"probe-{dims}").delete()
    with override_settings(EMBEDDING_DIMENSIONS=dims):
        kb = knowledge_base_create(owner=user, name=f"probe-{dims}")
    spec = BaseSpec(1 + seed % 10, f"probe-{dims}", chunks, "probe")

    def cut(vectors: np.ndarray) -> np.ndarray:
        v = vectors[:, :dims]
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    stats = LoadStats()
    with precomputed_embedder(dims) as fake:
        ingest_base(kb, spec, corpus, seed + 7, batch, fake, stats, transform=cut)
    return stats, kb


def backlog_probe(
    scenario: Scenario, queries: list[Query], corpus: Corpus, seed: int, n: int, batch: int
) -> None:
    """Hybrid latency of a scenario while ``n`` of its rows wait for the indexer."""
    kb = scenario.bases[0]

    def p50() -> float:
        for q in queries[:10]:
            run_search(q, "hybrid")
        return statistics.median(run_search(q, "hybrid")[1] for q in queries)

    before = p50()
    spec = BaseSpec(scenario.tenant, "backlog", n, "probe")
    keys = []
    with precomputed_embedder(DIMS) as fake:
        for start in range(0, n, batch):
            docs, vectors = make_documents(corpus, spec, start, min(batch, n - start), seed + 13)
            docs = [dataclasses.replace(d, source_key=f"backlog-{d.source_key}") for d in docs]
            keys += [d.source_key for d in docs]
            fake.load(vectors)
            knowledge_base_ingest(knowledge_base=kb, documents=docs)
    with_backlog = p50()
    rows, seconds = run_indexer()
    after = p50()
    print(
        f"backlog probe, {scenario.name}: hybrid p50 {before:.2f} ms -> {with_backlog:.2f} ms "
        f"with {n:,} rows pending -> {after:.2f} ms once indexed ({rows:,} rows in "
        f"{seconds:.1f}s = {rows / seconds:,.0f} rows/s); {len(queries)} queries"
    )
    knowledge_base_delete_chunks(knowledge_base=kb, document_keys=keys)


def hashing_rate(corpus: Corpus, n: int, seed: int) -> tuple[float, float]:
    """chunks/s of HashingEmbedder over n synthetic chunks: (cold feature cache, warm)."""
    spec = BaseSpec(1, "embed", n, "probe")
    docs, _ = make_documents(corpus, spec, 0, n, seed + 11)
    texts = [d.text for d in docs]
    embedder = HashingEmbedder(dimensions=DIMS)
    rates = []
    for _ in range(2):
        if not rates:
            _feature_slot.cache_clear()
        t0 = time.perf_counter()
        for start in range(0, n, 256):
            embedder.embed(texts[start : start + 256])
        rates.append(n / (time.perf_counter() - t0))
    return rates[0], rates[1]


# --- retrieval ------------------------------------------------------------------------
class PathRecorder:
    """Records which path each search's vector leg took (``knowledge.retrieval.vectors``:
    exact, index, or filtered: a scope of unknown size gated in the statement) and times
    the pieces of a search: building its statements and running them."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.seconds: Counter[str] = Counter()
        self.originals: dict[tuple[Any, str], Any] = {
            (search, "vector_leg"): search.vector_leg,
            (search, "rank"): search.rank,
            (bm25, "chunk_leg"): bm25.chunk_leg,
        }

    def __enter__(self) -> PathRecorder:
        for (module, name), fn in self.originals.items():
            setattr(module, name, self._wrap(name, fn))
        return self

    def __exit__(self, *exc: object) -> None:
        for (module, name), fn in self.originals.items():
            setattr(module, name, fn)

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
            if name == "vector_leg":
                self.calls.append(out.path)
            return out

        return wrapper

    def path(self) -> str:
        """The vector path of the last search, then reset."""
        calls, self.calls = self.calls, []
        return "+".join(calls) or "none"


@dataclass
class Scenario:
    name: str
    bases: list[KnowledgeBase]
    tenant: int
    session_filter: bool = False
    # one scope per query (a list of (bases, tenant)); used for the small tenants
    rotate: list[tuple[list[KnowledgeBase], int]] | None = None


@dataclass
class Query:
    vector: np.ndarray
    text: str
    bases: list[KnowledgeBase]
    session: str | None


def fetch_scope(bases: list[KnowledgeBase]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, vectors, session ids) of every chunk of ``bases`` (read as the tables' owner:
    a statement on the raw connection carries no owner's settings for the policies)."""
    with table_owner(connection):
        raw = services._raw_connection()  # registers pgvector's loaders on it
        with psycopg.Cursor(raw) as cur:  # Django's cursors are client-side: no binary results
            cur.execute(
                "SELECT id, embedding, session_id FROM knowledge_chunk "
                "WHERE knowledge_base_id = ANY(%s::uuid[]) ORDER BY id",
                ([str(kb.pk) for kb in bases],),
                binary=True,
            )
            rows = cur.fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    vectors = np.stack(
        [np.asarray(getattr(r[1], "to_numpy", lambda v=r[1]: v)(), dtype=np.float32) for r in rows]
    )
    sessions = np.array([r[2] for r in rows])
    return ids, vectors, sessions


class Truth:
    """Exact top-k by (cosine distance, id) over fetched scopes, cached per scope."""

    def __init__(self) -> None:
        self.scopes: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def top(self, query: Query, k: int) -> tuple[list[int], int]:
        key = tuple(sorted(str(kb.pk) for kb in query.bases))
        if key not in self.scopes:
            ids, vecs, sess = fetch_scope(query.bases)
            norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
            self.scopes[key] = (ids, vecs.astype(np.float64) / norms[:, None], sess)
        ids, unit, sess = self.scopes[key]
        if query.session is not None:
            keep = sess == query.session
            ids, unit = ids[keep], unit[keep]
        q = query.vector.astype(np.float64)
        dist = 1.0 - unit @ (q / np.linalg.norm(q))
        order = np.lexsort((ids, dist))[:k]
        return ids[order].tolist(), len(ids)


def build_scenarios(specs: list[BaseSpec]) -> list[Scenario]:
    """The five retrieval scenarios over the loaded bases (also bench_search_ab.py's)."""
    bases = {(int(kb.owner.username[len(USER_PREFIX) :]), kb.name): kb for kb in bench_bases()}
    small_tenants = sorted(
        (s for s in specs if s.role == "small"), key=lambda s: -s.rows
    )  # largest first
    picks = small_tenants[:: max(1, len(small_tenants) // 10)][:10]
    return [
        Scenario(
            "1 small tenant base (x10 tenants)",
            [],
            0,
            rotate=[([bases[(s.tenant, "main")]], s.tenant) for s in picks],
        ),
        Scenario("2 large tenant base", [bases[(0, "big")]], 0),
        Scenario("3 large base + session filter", [bases[(0, "big")]], 0, session_filter=True),
        Scenario(
            "4 all bases of the large tenant",
            [bases[(0, "big")], bases[(0, "notes")], bases[(0, "files")]],
            0,
        ),
        Scenario(
            "5 all bases of a mid tenant (x6)",
            [],
            1,
            rotate=[
                ([bases[(t, "main")], bases[(t, "archive")]], t)
                for t in range(1, len(MID_SHARES) + 1)
            ],
        ),
    ]


def make_queries(
    scenario: Scenario, corpus: Corpus, n: int, seed: int, query_noise: float
) -> list[Query]:
    rng = np.random.default_rng((seed, sum(map(ord, scenario.name))))
    trng = random.Random(seed * 31 + len(scenario.name))
    queries = []
    for i in range(n):
        bases, tenant = (
            scenario.rotate[i % len(scenario.rotate)]
            if scenario.rotate
            else (scenario.bases, scenario.tenant)
        )
        cluster = int(corpus.clusters_for(tenant, 1, rng)[0])
        vector = corpus.vectors(np.array([cluster]), rng, sigma=query_noise / np.sqrt(DIMS))[0]
        text = " ".join(trng.sample(corpus.cluster_words[cluster], 3))
        session = None
        if scenario.session_filter:
            session = f"t{tenant:03d}-s{int(rng.integers(0, SESSIONS_PER_TENANT)):02d}"
        queries.append(Query(vector, text, bases, session))
    return queries


def run_search(query: Query, mode: str, top_k: int = 10) -> tuple[list[int], float]:
    request = SearchRequest(
        query=query.text,
        vector=[float(x) for x in query.vector],
        top_k=top_k,
        mode=mode,
        filters={} if query.session is None else {"session_id": query.session},
    )
    t0 = time.perf_counter()
    hits = search_chunks(bases=query.bases, request=request)
    elapsed = time.perf_counter() - t0
    return [h.chunk_id for h in hits], elapsed * 1000


@dataclass
class ScenarioResult:
    name: str
    scope_rows: str
    hybrid_ms: list[float]
    vector_ms: list[float]
    recall: list[float]
    rows_hybrid: list[int]
    rows_vector: list[int]
    expected_rows: list[int]
    paths: Counter[str]
    breakdown: dict[str, float]

    def row_violations(self) -> int:
        return sum(
            got != min(10, want)
            for rows in (self.rows_hybrid, self.rows_vector)
            for got, want in zip(rows, self.expected_rows)
        )


def without_copies(chunks: Any) -> Any:
    """The chunks' collection as before their 16-bit copies (knowledge 0018): exact scans
    read the table, and every scope past ``exact_max`` walks the index."""
    return replace(chunks, copies="", walk_min_share=0.0, exact_cap=10**12)


def paired_collections(
    prepared: list[tuple[Scenario, list[Query]]], variants: dict[str, Any], warmup: int
) -> None:
    """Hybrid top 10 of each scenario's queries under two settings of the chunks'
    collection (``search.CHUNKS``), in one process, query by query, which goes first
    swapped every six queries (a rotating scenario's scopes get both orders); p50 / p95
    of each, the median of the per-query ratios (second / first) and how many queries'
    top 10 differ."""
    a, b = variants
    saved = search.CHUNKS
    print(f"\npaired hybrid top 10, {a} then {b} (ms; ratio = {b} / {a} per query)")
    try:
        for scenario, queries in prepared:
            times: dict[str, list[float]] = {a: [], b: []}
            differ = 0
            for i, query in enumerate(queries):
                got = {}
                for name in (a, b) if (i // 6) % 2 == 0 else (b, a):
                    search.CHUNKS = variants[name]
                    got[name], ms = run_search(query, "hybrid")
                    if i >= warmup:
                        times[name].append(ms)
                differ += i >= warmup and got[a] != got[b]
            ratio = statistics.median(y / x for x, y in zip(times[a], times[b]))
            print(
                f"{scenario.name:36} {a} {statistics.median(times[a]):6.2f} / "
                f"{pct(times[a], 95):6.2f}  {b} {statistics.median(times[b]):6.2f} / "
                f"{pct(times[b], 95):6.2f}  ratio {ratio:.2f}  top 10 differ {differ}"
            )
    finally:
        search.CHUNKS = saved


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def measure(scenario: Scenario, queries: list[Query], truth: Truth, warmup: int) -> ScenarioResult:
    for query in queries[:warmup]:  # warm caches and connections (not measured)
        run_search(query, "hybrid")
        run_search(query, "vector")
    hybrid_ms, vector_ms, recall, rows_h, rows_v, expected = [], [], [], [], [], []
    paths: Counter[str] = Counter()
    with PathRecorder() as rec:
        for query in queries:
            ids, ms = run_search(query, "hybrid")
            rec.path()
            hybrid_ms.append(ms)
            rows_h.append(len(ids))
        hybrid_seconds = dict(rec.seconds)
        rec.seconds.clear()
        got = []
        for query in queries:
            ids, ms = run_search(query, "vector")
            paths[rec.path()] += 1
            vector_ms.append(ms)
            rows_v.append(len(ids))
            got.append(ids)
    # Ground truth after the timed loops, so numpy never runs between two searches.
    for query, ids in zip(queries, got):
        want, matching = truth.top(query, 10)
        expected.append(matching)
        recall.append(len(set(ids) & set(want)) / len(want) if want else 1.0)
    sizes = sorted({n for n in expected})
    scope = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
    per_query = {k: 1000 * v / len(queries) for k, v in hybrid_seconds.items()}
    return ScenarioResult(
        scenario.name,
        scope,
        hybrid_ms,
        vector_ms,
        recall,
        rows_h,
        rows_v,
        expected,
        paths,
        per_query,
    )


def print_results(results: list[ScenarioResult]) -> None:
    head = (
        f"{'scenario':<34} {'scope rows':>13} {'hyb p50':>8} {'hyb p99':>8} "
        f"{'vec p50':>8} {'vec p99':>8} {'recall@10':>17} {'rows min/med':>12} "
        f"{'bad':>4}  vector path"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        paths = ", ".join(f"{k} {v}" for k, v in sorted(r.paths.items()))
        rows = f"{min(r.rows_hybrid + r.rows_vector)}/{statistics.median(r.rows_hybrid):g}"
        rec = f"{statistics.mean(r.recall):.3f} (min {min(r.recall):.1f})"
        print(
            f"{r.name:<34} {r.scope_rows:>13} {statistics.median(r.hybrid_ms):>8.2f} "
            f"{pct(r.hybrid_ms, 99):>8.2f} {statistics.median(r.vector_ms):>8.2f} "
            f"{pct(r.vector_ms, 99):>8.2f} {rec:>17} {rows:>12} {r.row_violations():>4}  {paths}"
        )
    print()
    print("hybrid: mean ms per query inside search_chunks (legs built, statements run)")
    for r in results:
        parts = ", ".join(
            f"{k.strip('_')} {v:.2f}" for k, v in sorted(r.breakdown.items(), key=lambda x: -x[1])
        )
        print(f"  {r.name:<32} {parts}")


# --- tuning alternatives (--tune) -------------------------------------------------------
@contextlib.contextmanager
def variant(overrides: dict[str, Any]):
    """Module constants and collection options changed for a while ("hnsw.EF_SEARCH",
    "CHUNKS.exact_max", "SPLIT_MIN_ROWS")."""
    saved = (hnsw.EF_SEARCH, hnsw.MAX_SCAN_TUPLES, search.CHUNKS, search.SPLIT_MIN_ROWS)
    try:
        for name, value in overrides.items():
            if name.startswith("hnsw."):
                setattr(hnsw, name[5:], value)
            elif name.startswith("CHUNKS."):
                search.CHUNKS = replace(search.CHUNKS, **{name[7:]: value})
            else:
                setattr(search, name, value)
        yield
    finally:
        hnsw.EF_SEARCH, hnsw.MAX_SCAN_TUPLES, search.CHUNKS, search.SPLIT_MIN_ROWS = saved


def tune(scenarios: list[tuple[Scenario, list[Query]]], truth: Truth, n: int) -> None:
    variants: list[tuple[str, dict[str, Any]]] = [
        ("defaults", {}),
        ("legs one after the other", {"SPLIT_MIN_ROWS": 10**12}),
        ("ef_search 40", {"hnsw.EF_SEARCH": 40}),
        ("ef_search 200", {"hnsw.EF_SEARCH": 200}),
        ("ef_search 400", {"hnsw.EF_SEARCH": 400}),
        ("ef_search 800", {"hnsw.EF_SEARCH": 800}),
        ("max_scan_tuples 20000", {"hnsw.MAX_SCAN_TUPLES": 20_000}),
        ("exact_max 0 (index always)", {"CHUNKS.exact_max": 0}),
        ("exact_max 2000", {"CHUNKS.exact_max": 2_000}),
        ("exact_max 5000", {"CHUNKS.exact_max": 5_000}),
        ("exact_max 50000", {"CHUNKS.exact_max": 50_000}),
    ]
    print()
    print(f"tuning alternatives ({n} queries each; vector top-10 and hybrid top-10)")
    head = (
        f"{'scenario':<34} {'variant':<32} {'vec p50':>8} {'vec p99':>8} {'recall':>7} "
        f"{'hyb p50':>8} {'hyb p99':>8}  path"
    )
    print(head)
    print("-" * len(head))
    for scenario, queries in scenarios:
        sample = queries[:n]
        for label, overrides in variants:
            with variant(overrides), PathRecorder() as rec:
                for q in sample[:5]:
                    run_search(q, "vector")
                rec.path()
                vec_ms, got, hyb_ms = [], [], []
                paths: Counter[str] = Counter()
                for q in sample:
                    ids, ms = run_search(q, "vector")
                    paths[rec.path()] += 1
                    vec_ms.append(ms)
                    got.append(ids)
                for q in sample:
                    hyb_ms.append(run_search(q, "hybrid")[1])
            rec_values = []
            for q, ids in zip(sample, got):
                want, _ = truth.top(q, 10)
                rec_values.append(len(set(ids) & set(want)) / len(want) if want else 1.0)
            path = ", ".join(f"{k} {v}" for k, v in sorted(paths.items()))
            print(
                f"{scenario.name:<34} {label:<32} {statistics.median(vec_ms):>8.2f} "
                f"{pct(vec_ms, 99):>8.2f} {statistics.mean(rec_values):>7.3f} "
                f"{statistics.median(hyb_ms):>8.2f} {pct(hyb_ms, 99):>8.2f}  {path}"
            )


@contextlib.contextmanager
def deferred_indexing(deferred: bool):
    """Ingestion defers HNSW insertion to the background indexer (the service's only
    way); ``False`` puts rows in the index in the write, as it once could, to compare."""
    original = services._defer_indexing
    services._defer_indexing = (lambda kb: original(kb)) if deferred else (lambda kb: False)
    try:
        yield
    finally:
        services._defer_indexing = original


# --- main -------------------------------------------------------------------------------
def migrate_if_needed() -> None:
    bench_db.migrate_if_needed(log)


def server_facts() -> dict[str, str]:
    facts = {}
    with connection.cursor() as cur:
        for name in (
            "server_version",
            "shared_buffers",
            "work_mem",
            "maintenance_work_mem",
            "jit",
            "max_parallel_workers_per_gather",
        ):
            cur.execute(f"SHOW {name}")
            facts[name] = cur.fetchone()[0]
        cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        facts["pgvector"] = cur.fetchone()[0]
        cur.execute("SELECT pg_size_pretty(pg_relation_size('chunk_hnsw_half_384'))")
        facts["hnsw_384_size"] = cur.fetchone()[0]
        cur.execute("SELECT pg_size_pretty(pg_total_relation_size('knowledge_chunk'))")
        facts["chunk_table_total"] = cur.fetchone()[0]
    return facts


def hnsw_index_sql() -> tuple[str, str]:
    """(create, drop) SQL of the 384-dimension HNSW index, as migration 0011 has them."""
    migration = importlib.import_module("knowledge.migrations.0011_chunk_hnsw_halfvec")
    return (
        migration.halfvec_index_sql(DIMS),
        f"DROP INDEX CONCURRENTLY IF EXISTS chunk_hnsw_half_{DIMS}",
    )


def run_indexer() -> tuple[int, float]:
    """Drain the background indexer's queue in this process: (rows, seconds)."""
    t0 = time.perf_counter()
    total = 0
    while True:
        run = knowledge_index_pending(max_seconds=3600)
        total += run.indexed
        if run.finished:
            return total, time.perf_counter() - t0


def vacuum(table: str = "knowledge_chunk", analyze: bool = True) -> float:
    t0 = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(f"VACUUM {'(ANALYZE) ' if analyze else ''}{table}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200, help="per scenario")
    ap.add_argument("--fresh", action="store_true", help="rebuild the data set")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--batch", type=int, default=1000, help="documents per ingest call")
    ap.add_argument("--probe-chunks", type=int, default=5_000)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--noise", type=float, default=1.0, help="norm of a point's noise")
    ap.add_argument("--query-noise", type=float, default=0.5, help="norm of a query's noise")
    ap.add_argument("--tune", action="store_true", help="also measure setting alternatives")
    ap.add_argument("--tune-queries", type=int, default=100)
    ap.add_argument("--skip-probes", action="store_true")
    ap.add_argument(
        "--paired-copies",
        action="store_true",
        help="also time each scenario with and without the chunks' 16-bit copies, paired",
    )
    ap.add_argument(
        "--bulk-load",
        action="store_true",
        help="with a rebuild: drop the HNSW index, load, then rebuild it (insert-then-build)",
    )
    ap.add_argument("--build-mem", default="1GB", help="maintenance_work_mem for --bulk-load")
    args = ap.parse_args()
    started = time.perf_counter()

    migrate_if_needed()
    db = settings.DATABASES["default"]["NAME"]
    print(
        f"database={db} provider={settings.EMBEDDING_PROVIDER} chunks={args.chunks:,} "
        f"queries/scenario={args.queries} seed={args.seed} noise={args.noise} "
        f"query_noise={args.query_noise} exact_max={search.CHUNKS.exact_max} "
        f"max_scan_tuples={hnsw.MAX_SCAN_TUPLES} cpus={os.cpu_count()}"
    )
    specs = plan_bases(args.chunks, args.seed)
    corpus = Corpus(args.seed, args.noise)
    marker = _marker(args.chunks, args.seed, args.noise)

    # 1. data set ------------------------------------------------------------------
    if not args.fresh and existing_data_matches(specs, marker):
        print(f"reusing the {args.chunks:,} chunks already in '{db}' (--fresh rebuilds)")
    else:
        log("building the data set ...")
        drop_bench_data()
        vacuum()
        create_sql, drop_sql = hnsw_index_sql()
        build_s = None
        if args.bulk_load:
            with connection.cursor() as cur:
                cur.execute(drop_sql)
        try:
            # Insert-then-build: rows go in as indexed (there is no HNSW index to
            # maintain), and the build afterwards takes them all.
            with deferred_indexing(not args.bulk_load):
                load = load_dataset(specs, corpus, args.seed, args.batch, marker)
        finally:
            if args.bulk_load:
                log("building the HNSW index ...")
                t0 = time.perf_counter()
                with connection.cursor() as cur:
                    # No HNSW index to maintain: clearing the flags is a plain update.
                    cur.execute(
                        "UPDATE knowledge_chunk SET index_pending = false WHERE index_pending"
                    )
                    cur.execute(f"SET maintenance_work_mem = '{args.build_mem}'")
                    cur.execute(create_sql)
                    cur.execute("RESET maintenance_work_mem")
                build_s = time.perf_counter() - t0
        index_state = (
            "HNSW dropped, GIN present"
            if args.bulk_load
            else "HNSW+GIN present, HNSW insertion deferred to the indexer"
        )
        print(
            f"ingest (full load, {index_state}, table 0 -> "
            f"{args.chunks:,}): {load.rate:,.0f} chunks/s over {load.seconds:.1f}s write time; "
            f"median {args.batch}-doc batch {statistics.median(load.batch_seconds) * 1000:.0f} ms; "
            f"last 10% of batches {load.tail_rate():,.0f} chunks/s"
        )
        if build_s is not None:
            print(
                f"HNSW build afterwards (m=16, ef_construction=64, maintenance_work_mem="
                f"{args.build_mem}): {build_s:.1f}s; insert-then-build overall "
                f"{args.chunks / (load.seconds + build_s):,.0f} chunks/s"
            )
        else:
            rows, seconds = run_indexer()
            print(
                f"background indexer afterwards (HNSW insertion of the pending rows): {rows:,} "
                f"rows in {seconds:.1f}s = {rows / seconds:,.0f} rows/s"
            )
        print(f"VACUUM ANALYZE after load: {vacuum():.1f}s")
    sizes = Counter(s.role for s in specs)
    chars = Chunk.objects.filter(knowledge_base__in=bench_bases()[:3]).values_list(
        "text", flat=True
    )[:2000]
    print(
        f"bases: {len(specs)} ({dict(sizes)}), mean chunk length "
        f"{statistics.mean(len(t) for t in chars):.0f} chars; server: {server_facts()}"
    )

    # 2. retrieval -----------------------------------------------------------------
    scenarios = build_scenarios(specs)
    truth = Truth()
    results = []
    prepared = []
    for scenario in scenarios:
        queries = make_queries(scenario, corpus, args.queries, args.seed, args.query_noise)
        log(f"measuring {scenario.name} ...")
        results.append(measure(scenario, queries, truth, args.warmup))
        prepared.append((scenario, queries))
    print()
    print(
        "retrieval: top_k=10, latency in ms around search_chunks (service-side), "
        f"{args.queries} queries/scenario after {args.warmup} warm-up; recall@10 = vector mode "
        "vs numpy brute force; rows = hits returned (hybrid and vector), bad = rows != "
        "min(10, matching)"
    )
    print_results(results)
    if args.paired_copies:
        variants = {"without": without_copies(search.CHUNKS), "copies": search.CHUNKS}
        paired_collections(prepared, variants, args.warmup)
    if args.tune:
        tune(prepared, truth, args.tune_queries)

    # 3. ingestion probes at full table size ------------------------------------------
    print()
    emb_cold, emb_warm = hashing_rate(corpus, 20_000, args.seed)
    print(
        f"hashing embedder (384 dims, 20,000 chunks, batches of 256): {emb_cold:,.0f} chunks/s "
        f"cold feature cache, {emb_warm:,.0f} chunks/s warm"
    )
    if not args.skip_probes:
        probes = []
        variants = (
            (DIMS, True, "HNSW insertion deferred to the indexer"),
            (DIMS, False, "HNSW maintained in the write"),
            (DIMS - 1, True, "outside the HNSW index"),
        )
        for dims, deferred, label in variants:
            with deferred_indexing(deferred):
                stats, kb = probe_ingest(corpus, args.seed, args.probe_chunks, args.batch, dims)
            probes.append(kb)
            print(
                f"ingest probe {args.probe_chunks:,} chunks into a {dims}-dim base "
                f"({label}, table at {args.chunks:,}): {stats.rate:,.0f} chunks/s; median "
                f"{args.batch}-doc batch {statistics.median(stats.batch_seconds) * 1000:.0f} ms"
            )
            if deferred and dims == DIMS:
                rows, seconds = run_indexer()
                print(
                    f"  background indexer for those: {rows:,} rows in {seconds:.1f}s = "
                    f"{rows / seconds:,.0f} rows/s"
                )
        for kb in probes:
            knowledge_base_delete(knowledge_base=kb)
        large = next(p for p in prepared if p[0].name.startswith("2 "))
        backlog_probe(large[0], large[1][:100], corpus, args.seed, args.probe_chunks, args.batch)
        print(f"VACUUM after deleting the probes: {vacuum():.1f}s")
    print(f"\ntotal bench time {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
