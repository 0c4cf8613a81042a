"""Memory stores: retrieve latency for a node with three attachments, and write throughput.

Run from the repository root, against a private database:

    EMBEDDED_DB_NAME=bench_stores EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_stores.py [--items 10000] [--calls 200] [--writes 300] [--fresh]

(both variables default to those values here, so the bench never writes into the
development database). The data is built once and reused (``--fresh`` rebuilds it).

Data: one owner, one flow, and
* node ``three-simple``: three ``simple`` stores of ``--items`` items each (top_k 5, so
  15 candidates each by cosine, reranked), the worst case: three exact vector scans;
* node ``mixed``: a ``simple`` store, a ``file`` store whose knowledge base holds
  ``--items`` chunks (generated .md files, 500/50 chunks) and a ``blackboard`` of
  ``--items`` entries.
Items are turns of 12-40 words ("Input: ... Output: ..." summaries, 384-dimension
hashing embeddings).

Reported, p50/p95 (and mean) over ``--calls`` calls after 10 warm-up calls:
``node_memory_retrieve`` (service side, no HTTP) at stage ``gen`` with a default block
budget, for each node; the query embedding (hashing, one 384-d vector) is timed
apart and subtracted in the "excl. embedding" column. Then ``--writes`` sequential
``node_memory_write`` calls to ``three-simple`` (each: three summaries embedded, one
transaction, the stores' locks, dedup check, insert with its HNSW entry, trim to
max_items = --items). Also: ``three-simple`` with the node's three searches together
(at once, each on its own connection) against one store after another, interleaved;
recall@15 of the HNSW path against the exact scan for store s1 at ef_search 40-200, and
both paths' latency for one store; recall@5 of the file store's chunk search through
the chunks' HNSW index (its path above the chunks' ``exact_max``) against its exact scan.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_stores")
os.environ.setdefault("EMBEDDING_PROVIDER", "hashing")

import django
import numpy as np

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from core.providers.embeddings import get_embedder
from knowledge import search as chunk_search
from knowledge.retrieval import hnsw
from knowledge.services import knowledge_index_pending
from memories.conversations.models import Flow
from memories.conversations.services import flow_create
from memories.stores import runtime
from memories.stores import search as store_search
from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryItem, MemoryStore
from memories.stores.runtime import node_memory_retrieve, node_memory_write
from memories.stores.search import ChunkSearch, ItemSearch, SearchBatch
from memories.stores.services import memory_store_delete, memory_store_load
from memories.stores.text import summary_hash, turn_summary

WORDS = (
    "the a to of and in is it you that for on with as was be this have are not but they at "
    "what so if can about from will your there which one all would their an my by do more "
    "memory model token budget thread branch answer question context history window prompt "
    "train Lisbon Porto ticket weather museum restaurant river deploy database index query "
    "latency schedule invoice customer meeting Thursday project review design cache storage"
).split()
OWNER = "bench-stores"


def log(message: str) -> None:
    print(message, flush=True)


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize() + "."


def migrate_if_needed() -> None:
    bench_db.migrate_if_needed(log)


def fill_items(store: MemoryStore, n: int, rng: random.Random, *, embed: bool) -> None:
    embedder = get_embedder()
    batch: list[MemoryItem] = []
    for i in range(n):
        summary = turn_summary(sentence(rng, 6, 20), sentence(rng, 12, 40), max_chars=500)
        batch.append(
            MemoryItem(
                store=store,
                content_summary=f"{summary} #{i}",
                summary_hash=summary_hash(f"{summary} #{i}") if embed else None,
                input_snapshot={"text": summary[:80], "blocks": []},
                output_snapshot={"text": summary, "blocks": []},
                metadata={},
            )
        )
        if len(batch) == 1000 or i == n - 1:
            if embed:
                vectors = embedder.embed([item.content_summary for item in batch])
                for item, vector in zip(batch, vectors):
                    item.embedding = vector
                    item.dimensions = len(vector)
            MemoryItem.objects.bulk_create(batch)
            batch = []


def build(items: int, docs_dir: Path) -> Flow:
    rng = random.Random(11)
    owner, _ = get_user_model().objects.get_or_create(username=OWNER)
    flow = flow_create(owner=owner, name="bench")
    # Files: 5 chunks of ~500 characters each per file -> ``items`` chunks in all.
    for f in range(items // 5):
        text = " ".join(sentence(rng, 10, 14) for _ in range(38))[:2250]
        (docs_dir / f"doc{f:05d}.md").write_text(text, encoding="utf-8")
    settings.MEMORY_STORE_FILE_ROOTS = [str(docs_dir)]
    simple = {"max_items": items}
    doc = {
        "memory": [
            {"name": "s1", "type": "simple", "config": simple},
            {"name": "s2", "type": "simple", "config": simple},
            {"name": "s3", "type": "simple", "config": simple},
            {"name": "files", "type": "file", "config": {"file_sources": [{"path": "."}]}},
            {"name": "board", "type": "blackboard", "config": {"max_items": items}},
        ],
        "nodes": [
            {
                "id": "three-simple",
                "flow": "bench",
                "memories": [{"name": n, "top_k": 5} for n in ("s1", "s2", "s3")],
            },
            {
                "id": "mixed",
                "flow": "bench",
                "memories": [
                    {"name": "s1", "top_k": 5},
                    {"name": "files", "top_k": 5, "write": False},
                    {"name": "board", "top_k": 5},
                ],
            },
        ],
    }
    memory_config_apply(owner=owner, document=doc, load=False)
    stores = {s.name: s for s in MemoryStore.objects.filter(owner=owner)}
    for name in ("s1", "s2", "s3"):
        log(f"filling {name} with {items} items ...")
        fill_items(stores[name], items, rng, embed=True)
    fill_items(stores["board"], items, rng, embed=False)
    log(f"indexing {items // 5} files ...")
    started = time.perf_counter()
    report = memory_store_load(store=stores["files"])
    log(f"  {report} in {time.perf_counter() - started:.1f} s")
    while not knowledge_index_pending().finished:
        pass
    with connection.cursor() as cur:
        cur.execute("ANALYZE memory_stores_memoryitem")
        cur.execute("ANALYZE knowledge_chunk")
    return flow


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {p50:7.2f} ms  p95 {p95:7.2f} ms  mean {statistics.fmean(ordered):7.2f} ms"


def timed(fn: Callable[[], object], calls: int) -> list[float]:
    for _ in range(10):
        fn()
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    migrate_if_needed()
    docs_dir = Path(tempfile.gettempdir()) / "bench_stores_docs"
    docs_dir.mkdir(exist_ok=True)
    settings.MEMORY_STORE_FILE_ROOTS = [str(docs_dir)]
    flow = Flow.objects.filter(owner__username=OWNER, name="bench").first()
    if args.fresh and flow is not None:
        for store in MemoryStore.objects.filter(owner=flow.owner):
            memory_store_delete(store=store)  # a file store's knowledge base with it
        get_user_model().objects.filter(username=OWNER).delete()
        flow = None
    if flow is None:
        for old in docs_dir.glob("*.md"):
            old.unlink()
        flow = build(args.items, docs_dir)
    counts = {
        s.name: s.items.count() if s.type != "file" else s.knowledge_base.chunk_count
        for s in MemoryStore.objects.filter(owner=flow.owner).select_related("knowledge_base")
    }
    log(f"python {platform.python_version()}, {os.cpu_count()} cpus; store sizes {counts}")

    rng = random.Random(5)
    queries = [sentence(rng, 6, 20) for _ in range(64)]
    position = {"i": 0}

    def next_query() -> str:
        position["i"] += 1
        return queries[position["i"] % len(queries)]

    embedder = get_embedder()
    embed = timed(lambda: embedder.embed([next_query()]), args.calls)
    log(f"query embedding (hashing, 384 d):       {percentiles(embed)}")
    embed_p50 = statistics.median(embed)
    for node in ("three-simple", "mixed"):
        samples = timed(
            lambda node=node: node_memory_retrieve(
                flow=flow, node_id=node, stage="gen", query=next_query()
            ),
            args.calls,
        )
        excl = [s - embed_p50 for s in samples]
        log(f"retrieve {node:13} (3 attachments):  {percentiles(samples)}")
        log(f"  excl. embedding:                      {percentiles(excl)}")

    # The node's three searches run together (a SearchBatch: at once, each on its own
    # connection) against one store after another (the same searches, each store alone:
    # RetrieveQuery without a SearchBatch),
    # interleaved call by call so that load hits both alike.
    batched_ms: list[float] = []
    alone_ms: list[float] = []
    for i in range(args.calls + 10):
        for batch in (True, False) if i % 2 else (False, True):
            query = next_query()
            runtime.SearchBatch = SearchBatch if batch else (lambda: None)  # type: ignore[assignment]
            started = time.perf_counter()
            node_memory_retrieve(flow=flow, node_id="three-simple", stage="gen", query=query)
            if i >= 10:
                (batched_ms if batch else alone_ms).append((time.perf_counter() - started) * 1000)
    runtime.SearchBatch = SearchBatch  # type: ignore[misc]
    log(f"three-simple, searches at once:         {percentiles(batched_ms)}")
    log(f"three-simple, one store after another: {percentiles(alone_ms)}")
    ratio = statistics.median(batched_ms) / statistics.median(alone_ms)
    log(f"  ratio of p50s: {ratio:.2f}")

    # Recall of the index path against the exact scan (the 15 candidates of store s1, its
    # vector leg alone), and one store's search both ways, interleaved so that load hits
    # both alike. The walk's ef_search is the retrieval package's constant
    # (``hnsw.EF_SEARCH``); the exact scan is the collection with ``exact_max`` above the
    # store's size.
    items, chunks, default_ef = store_search.ITEMS, chunk_search.CHUNKS, hnsw.EF_SEARCH

    def store_run(search: ItemSearch, exactly: bool) -> list[Any]:
        store_search.ITEMS = replace(items, exact_max=10**9) if exactly else items
        try:
            return store_search.run([search])[0]
        finally:
            store_search.ITEMS = items

    s1 = MemoryStore.objects.get(owner=flow.owner, name="s1")
    searches = [ItemSearch.of(s1, "", embedder.embed([q])[0], 15, None, 0.0) for q in queries[:50]]
    exact = [{h.id for h in store_run(s, True)} for s in searches]
    exact_ms: list[float] = []
    for ef in (40, 60, 80, 100, 200):
        hnsw.EF_SEARCH = ef
        found, index_ms = 0, []
        for wanted, search in zip(exact, searches, strict=True):
            started = time.perf_counter()
            found += len(wanted & {h.id for h in store_run(search, False)})
            index_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            store_run(search, True)
            exact_ms.append((time.perf_counter() - started) * 1000)
        recall = found / sum(len(w) for w in exact)
        log(f"one store, HNSW ef_search {ef:3}: recall@15 {recall:.3f}, {percentiles(index_ms)}")
    hnsw.EF_SEARCH = default_ef
    log(f"one store, exact scan of {counts['s1']} items:  {percentiles(exact_ms)}")

    # The file store of node ``mixed``: recall@5 of the chunks' HNSW path against the
    # exact scan (the chunks' collection with ``exact_max`` 0, then above the base's size).
    files = MemoryStore.objects.select_related("knowledge_base").get(owner=flow.owner, name="files")
    kb = files.knowledge_base
    found = 0
    for q in queries[:50]:
        vector = np.asarray(embedder.embed([q])[0], dtype=np.float64).tobytes()
        search = ChunkSearch(kb, q, vector, 5, None)
        got = []
        for cap in (0, 10**9):
            chunk_search.CHUNKS = replace(chunks, exact_max=cap)
            try:
                got.append({h.chunk_id for h in store_search.run([search])[0]})
            finally:
                chunk_search.CHUNKS = chunks
        found += len(got[0] & got[1])
    recall = found / (5 * 50)
    log(f"file store, chunks' HNSW ef_search {default_ef}: recall@5 {recall:.3f} against exact")
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) / 8192 FROM "
            "pg_index WHERE indrelid = 'memory_stores_memoryitem'::regclass AND "
            "indexrelid::regclass::text LIKE 'memoryitem_hnsw%%384'"
        )
        log(f"HNSW index of 384 dimensions (pages of 8 kB): {cur.fetchall()}")

    started = time.perf_counter()
    for n in range(args.writes):
        node_memory_write(
            flow=flow,
            node_id="three-simple",
            input=f"bench question {n} {next_query()}",
            output=f"bench answer {n}: {sentence(rng, 12, 40)}",
        )
    elapsed = time.perf_counter() - started
    log(
        f"write to three-simple: {args.writes} writes in {elapsed:.2f} s = "
        f"{args.writes / elapsed:.0f} writes/s ({args.writes * 3 / elapsed:.0f} store items/s), "
        f"{elapsed / args.writes * 1000:.2f} ms per write"
    )
    sizes = [
        MemoryItem.objects.filter(store__name=n, store__owner=flow.owner).count()
        for n in ("s1", "s2", "s3")
    ]
    log(f"store sizes after the writes (trimmed to max_items): {sizes}")


if __name__ == "__main__":
    main()
