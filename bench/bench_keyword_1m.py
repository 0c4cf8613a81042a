"""The keyword leg (BM25) and hybrid search at a million chunks, on synthetic Zipfian text.

Run from the repository root, against a private database kept between runs:

    EMBEDDED_DB_NAME=bench_kw1m .venv/bin/python bench/bench_keyword_1m.py \\
        [--chunks 1000000] [--queries 200] [--fresh] [--before /path/to/old/checkout] \\
        [--paired-copies]

Data (built once, reused while the marker matches; ``--fresh`` rebuilds): the bases and
tenants of ``bench_knowledge.py`` (``plan_bases``: one 300,000-chunk base at 1M, six mid
tenants, 93 small ones), its clustered 384-dimension vectors, and text that is not its
six-word cluster vocabularies but closer to real text: each chunk 12-60 tokens, 80% of
them drawn from a 50,000-word vocabulary with Zipfian frequencies (exponent 1.0; the 40
most frequent "words" are English stop words, which the text-search configuration drops),
20% from the chunk's topic (its vector's cluster: 60 words of middling rank, Zipfian
within the topic). Rows are written with COPY straight into ``knowledge_chunk`` (the
statistics triggers run, per batch of 20,000), the GIN and HNSW indexes built after the
load, the bases' counters recounted. No embedder runs.

Queries, per scenario of ``bench_knowledge.py``: a chunk of the scenario's tenant is drawn
as the generator would write it, and 2-5 of its distinct words (stop words included when
drawn) are the text; the vector is a noisy copy of its cluster's centre. Printed per
scenario: the keyword leg (``keyword_ranking`` with the hybrid pool, 50) p50/p95 with the
pruned BM25 (the default), with every match scored (no pruning: the definition) and, with
``--before``, the keyword leg and the hybrid search of that checkout; how many
queries' pruned top 50 differ from the exact BM25 top 50 (by id and order, exact ties
allowed); and hybrid top-10 p50/p95 through ``search_chunks``. Runs take turns per query.
``--paired-copies`` then times each scenario's hybrid search with the chunks' collection
as it is and without its 16-bit copies (``bench_knowledge.paired_collections``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_kw1m")

import bench_knowledge as bk  # noqa: E402  (sets Django up)
import numpy as np  # noqa: E402
from django.db import connection  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from knowledge import search  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.retrieval import bm25  # noqa: E402
from knowledge.services import ingest as services  # noqa: E402
from knowledge.services import knowledge_base_create, knowledge_base_recount  # noqa: E402

VOCABULARY = 50_000
TOPIC_WORDS = 60
TOPIC_SHARE = 0.2
STOP_WORDS = (
    "the of and to a in is it you that he was for on are with as i his they be at one have "
    "this from or had by not but what some we can out other were all there when"
).split()[:40]
DATA_VERSION = 1
# The text index the search uses (knowledge 0012), and the plain one 0012 dropped, which
# an older checkout's keyword leg (--before) needs.
GIN_SQL = (
    f"CREATE INDEX chunk_scoped_text_gin ON knowledge_chunk USING gin ({bm25.SCOPED_TEXT});"
    "CREATE INDEX chunk_search_vector_gin ON knowledge_chunk USING gin (search_vector)"
)


class ZipfText:
    """The vocabulary, its Zipfian distribution and the per-cluster topic words."""

    def __init__(self, seed: int):
        rng = random.Random(seed)
        words: list[str] = []
        seen = set(STOP_WORDS)
        while len(words) < VOCABULARY - len(STOP_WORDS):
            word = "".join(rng.choice(bk._SYLLABLES) for _ in range(rng.choice((2, 3, 3, 4))))
            if word not in seen:
                seen.add(word)
                words.append(word)
        self.words = np.array(STOP_WORDS + words)
        ranks = np.arange(1, VOCABULARY + 1, dtype=np.float64)
        self.cdf = np.cumsum(1.0 / ranks)
        self.cdf /= self.cdf[-1]
        nrng = np.random.default_rng(seed)
        # Topic words: middling ranks (200-20,000), Zipfian within the topic.
        self.topics = nrng.integers(200, 20_000, (bk.N_CLUSTERS, TOPIC_WORDS))
        tranks = np.arange(1, TOPIC_WORDS + 1, dtype=np.float64)
        self.tcdf = np.cumsum(1.0 / tranks)
        self.tcdf /= self.tcdf[-1]

    def texts(self, clusters: np.ndarray, rng: np.random.Generator) -> list[str]:
        lengths = rng.integers(12, 61, len(clusters))
        total = int(lengths.sum())
        glob = np.searchsorted(self.cdf, rng.random(total))
        topic = self.topics[
            np.repeat(clusters, lengths), np.searchsorted(self.tcdf, rng.random(total))
        ]
        tokens = self.words[np.where(rng.random(total) < TOPIC_SHARE, topic, glob)]
        out, start = [], 0
        for n in lengths:
            out.append(" ".join(tokens[start : start + n]))
            start += n
        return out


def _marker(total: int, seed: int) -> str:
    return f"bench-keyword-1m v{DATA_VERSION} chunks={total} seed={seed}"


_COLUMNS = (
    "knowledge_base_id, source_key, document_key, text, embedding, dimensions, fts_config, "
    "chunk_index, chunk_total, source_type, message_id, session_id, flow_id, run_id, sender, "
    "file_path, content_hash, source_timestamp, metadata, word_count, index_pending, "
    "created_at, updated_at"
)
_TYPES = [
    *("uuid", "text", "text", "text", "vector", "int2", "text", "int4", "int4", "text"),
    *("text", "text", "text", "text", "text", "text", "text", "timestamptz", "jsonb", "int4"),
    *("bool", "timestamptz", "timestamptz"),
]


def load(specs: list[bk.BaseSpec], corpus: bk.Corpus, text: ZipfText, seed: int, marker: str):
    """Write the chunks, then build the indexes, as the tables' owner (PostgreSQL refuses
    COPY into a table whose policies hold, and the indexes are the owner's)."""
    from core.db_backend.base import table_owner

    with table_owner(connection):
        _load(specs, corpus, text, seed, marker)


def _load(specs: list[bk.BaseSpec], corpus: bk.Corpus, text: ZipfText, seed: int, marker: str):
    from django.contrib.auth import get_user_model

    User = get_user_model()
    bk.drop_bench_data()
    create_hnsw, drop_hnsw = bk.hnsw_index_sql()
    with connection.cursor() as cur:
        cur.execute(drop_hnsw)
        cur.execute("DROP INDEX IF EXISTS chunk_search_vector_gin, chunk_scoped_text_gin")
    raw = services._raw_connection()
    t0 = time.perf_counter()
    done = 0
    now = bk.T_START
    for spec in specs:
        user, _ = User.objects.get_or_create(username=f"{bk.USER_PREFIX}{spec.tenant:03d}")
        kb = knowledge_base_create(owner=user, name=spec.name, description=marker)
        for start in range(0, spec.rows, 20_000):
            n = min(20_000, spec.rows - start)
            rng = np.random.default_rng((seed, spec.tenant, sum(map(ord, spec.name)), start))
            clusters = corpus.clusters_for(spec.tenant, n, rng)
            vectors = corpus.vectors(clusters, rng)
            texts = text.texts(clusters, rng)
            sessions = rng.integers(0, bk.SESSIONS_PER_TENANT, n)
            seconds = rng.integers(0, 365 * 86400, n)
            with raw.transaction(), raw.cursor() as cur:
                cur.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS kw1m_stage AS SELECT "
                    f"{_COLUMNS.replace('fts_config', 'fts_config::text')} "
                    "FROM knowledge_chunk LIMIT 0"
                )
                cur.execute("TRUNCATE kw1m_stage")
                with cur.copy(f"COPY kw1m_stage ({_COLUMNS}) FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(_TYPES)
                    for i in range(n):
                        key = f"d{start + i}"
                        cp.write_row(
                            (
                                kb.pk,
                                f"{key}#0",
                                key,
                                texts[i],
                                vectors[i],
                                bk.DIMS,
                                "english",
                                0,
                                1,
                                "message",
                                "",
                                f"t{spec.tenant:03d}-s{int(sessions[i]):02d}",
                                "",
                                "",
                                "",
                                "",
                                "",
                                bk.T_START + timedelta(seconds=int(seconds[i])),
                                Jsonb({}),
                                len(texts[i].split()),
                                False,
                                now,
                                now,
                            )
                        )
                cur.execute(
                    f"INSERT INTO knowledge_chunk ({_COLUMNS}) SELECT "
                    f"{_COLUMNS.replace('fts_config', 'fts_config::regconfig')} FROM kw1m_stage"
                )
            done += n
        knowledge_base_recount(knowledge_base=kb)
        bk.log(f"  {done:,} rows, {done / (time.perf_counter() - t0):,.0f} rows/s")
    load_s = time.perf_counter() - t0
    bk.log("building the GIN indexes ...")
    t1 = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute("SET maintenance_work_mem = '1GB'")
        cur.execute(GIN_SQL)
        gin_s = time.perf_counter() - t1
        bk.log("building the HNSW index ...")
        cur.execute("SET maintenance_work_mem = '3GB'")
        cur.execute(create_hnsw)
        cur.execute("RESET maintenance_work_mem")
    build_s = time.perf_counter() - t1 - gin_s
    print(
        f"load: {done:,} rows by COPY in {load_s:.0f}s ({done / load_s:,.0f} rows/s, statistics "
        f"triggers included); GIN build {gin_s:.0f}s; HNSW build {build_s:.0f}s; "
        f"VACUUM ANALYZE {bk.vacuum():.0f}s"
    )


def make_queries(
    scenario: bk.Scenario, corpus: bk.Corpus, text: ZipfText, n: int, seed: int
) -> list[bk.Query]:
    rng = np.random.default_rng((seed, 7, sum(map(ord, scenario.name))))
    out = []
    for i in range(n):
        bases, tenant = (
            scenario.rotate[i % len(scenario.rotate)]
            if scenario.rotate
            else (scenario.bases, scenario.tenant)
        )
        cluster = corpus.clusters_for(tenant, 1, rng)
        words = list(dict.fromkeys(text.texts(cluster, rng)[0].split()))
        picked = rng.choice(len(words), min(len(words), int(rng.integers(2, 6))), replace=False)
        vector = corpus.vectors(cluster, rng, sigma=0.5 / np.sqrt(bk.DIMS))[0]
        session = None
        if scenario.session_filter:
            session = f"t{tenant:03d}-s{int(rng.integers(0, bk.SESSIONS_PER_TENANT)):02d}"
        out.append(bk.Query(vector, " ".join(words[j] for j in picked), bases, session))
    return out


def keyword(module, query: bk.Query, limit: int) -> tuple[list[tuple[int, float]], float]:
    request = module.SearchRequest(
        query=query.text,
        filters={} if query.session is None else {"session_id": query.session},
    )
    kb_ids = [str(kb.pk) for kb in query.bases]
    t0 = time.perf_counter()
    if module is search:  # this checkout: the search's keyword leg, run alone
        rows = [(r[0], float(r[1])) for r in search._keyword_leg(query.bases, request, limit).run()]
    else:
        rows = module.keyword_ranking(kb_ids, "english", query.text, request, limit)
    return rows, (time.perf_counter() - t0) * 1000


@contextlib.contextmanager
def unpruned():
    """Every match of a large base ranked (no top-k pruning): the definition."""
    saved, bm25.PRUNE_MIN_ROWS = bm25.PRUNE_MIN_ROWS, 10**12
    try:
        yield
    finally:
        bm25.PRUNE_MIN_ROWS = saved


def hybrid_before(before, query: bk.Query) -> float:
    request = before.SearchRequest(
        query=query.text, vector=[float(x) for x in query.vector], top_k=10,
        filters={} if query.session is None else {"session_id": query.session},
    )  # fmt: skip
    t0 = time.perf_counter()
    before.search_chunks(bases=query.bases, request=request)
    return (time.perf_counter() - t0) * 1000


def same_ranking(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """Same ids in the same order, but for chunks whose scores tie."""
    if len(got) != len(want):
        return False
    for (gid, gs), (wid, ws) in zip(got, want):
        if gid != wid and abs(gs - ws) > 1e-9 * max(1.0, abs(ws)):
            return False
    return all(abs(g[1] - w[1]) <= 1e-9 * max(1.0, abs(w[1])) for g, w in zip(got, want))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--load-only", action="store_true")
    ap.add_argument("--before", type=Path, help="a checkout whose keyword leg to time too")
    ap.add_argument(
        "--paired-copies",
        action="store_true",
        help="then time each scenario's hybrid with and without the chunks' 16-bit copies",
    )
    args = ap.parse_args()
    bk.migrate_if_needed()
    specs = bk.plan_bases(args.chunks, args.seed)
    corpus = bk.Corpus(args.seed, 1.0)
    text = ZipfText(args.seed)
    marker = _marker(args.chunks, args.seed)
    if args.fresh or not bk.existing_data_matches(specs, marker):
        bk.log(f"loading {args.chunks:,} chunks ...")
        load(specs, corpus, text, args.seed, marker)
    else:
        print(f"reusing the {args.chunks:,} chunks already in the database (--fresh rebuilds)")
    if args.load_only:
        return
    before = None
    if args.before:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from before import load_before

        bk.bench_db.connect_as_tables_owner()  # (the older search sends no owner settings)
        before = load_before(args.before)
    limit = 50
    print(
        f"keyword leg = keyword_ranking(limit {limit}); hybrid = search_chunks top 10; ms; "
        f"{args.queries} queries per scenario after {args.warmup} warm-ups"
    )
    head = (
        f"{'scenario':36} {'pruned p50':>10} {'p95':>6} {'all p50':>8} {'p95':>6} "
        f"{'before p50':>11} {'p95':>6} {'differ':>6} {'hybrid p50':>10} {'p95':>6} "
        f"{'before p50':>10} {'p95':>6}"
    )
    print(head)
    for scenario in bk.build_scenarios(specs):
        queries = make_queries(scenario, corpus, text, args.queries, args.seed)
        for q in queries[: args.warmup]:
            keyword(search, q, limit)
            bk.run_search(q, "hybrid")
            with unpruned():
                keyword(search, q, limit)
            if before:
                keyword(before, q, limit)
                hybrid_before(before, q)
        pruned, full, old, hybrid, old_hybrid, differ = [], [], [], [], [], 0
        for i, q in enumerate(queries):
            # Each run goes first for a fifth of the queries (the first to read a
            # query's rows finds them less often in the caches), and each of a pair
            # compared goes before the other for half of them: in a fixed cycle the old
            # hybrid search ran right after this one, on the pages it had just read, four
            # times in five.
            runs = ["pruned", "full", "old", "hybrid", "old hybrid"]
            runs = runs[i % 5 :] + runs[: i % 5]
            if (i // 5) % 2:
                swap = {"pruned": "old", "old": "pruned", "hybrid": "old hybrid",
                        "old hybrid": "hybrid"}  # fmt: skip
                runs = [swap.get(run, run) for run in runs]
            for run in runs:
                if run == "pruned":
                    got, ms = keyword(search, q, limit)
                    pruned.append(ms)
                elif run == "full":
                    with unpruned():
                        want, ms = keyword(search, q, limit)
                    full.append(ms)
                elif run == "old" and before:
                    old.append(keyword(before, q, limit)[1])
                elif run == "hybrid":
                    hybrid.append(bk.run_search(q, "hybrid")[1])
                elif run == "old hybrid" and before:
                    old_hybrid.append(hybrid_before(before, q))
            differ += not same_ranking(got, want)

        def cell(values: list[float]) -> str:
            if not values:
                return f"{'-':>8} {'-':>6}"
            return f"{statistics.median(values):8.2f} {bk.pct(values, 95):6.2f}"

        print(
            f"{scenario.name:36} {cell(pruned):>17} {cell(full):>15} {cell(old):>18} "
            f"{differ:>6} {cell(hybrid):>17} {cell(old_hybrid):>17}"
        )
    if args.paired_copies:
        prepared = [
            (scenario, make_queries(scenario, corpus, text, args.queries + args.warmup, args.seed))
            for scenario in bk.build_scenarios(specs)
        ]
        variants = {"without": bk.without_copies(search.CHUNKS), "copies": search.CHUNKS}
        bk.paired_collections(prepared, variants, args.warmup)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_size_pretty(pg_total_relation_size('knowledge_chunk'))")
        size = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM knowledge_term_stats")
        lexemes = cur.fetchone()[0]
    print(
        f"table with indexes {size}; {lexemes:,} (base, lexeme) statistics rows; "
        f"bases {KnowledgeBase.objects.count()}"
    )


if __name__ == "__main__":
    main()
