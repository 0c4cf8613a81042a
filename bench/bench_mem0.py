"""mem0 OSS side by side with the engine: the same facts, the same Postgres, the same
vectors (no embedding model: both sides get precomputed vectors).

Runs in mem0's own virtualenv (mem0ai and its dependencies are not this project's),
against the embedded server of this worktree, after ``bench/bench_engine.py`` loaded
its data (database ``bench_engine``, or ``ENGINE_DB``; the server's socket directory is
``PG_SOCKET``, by default this worktree's ``.data/pgdata``)::

    /work/scratch-mem0/venv/bin/python bench/bench_mem0.py [--queries 100] [--fresh] [--large]

It copies the engine bench's owner's facts of the scopes ``["bench", "big"]`` (10,000)
and ``["bench", "inj"]`` (500) (text and vector, as stored) into a mem0 pgvector
collection in database ``mem0bench`` (HNSW index, mem0's default payload: data, hash,
user_id, created_at, text_lemmatized), one mem0 ``user_id`` per scope, then times
``Memory.search(query, filters={"user_id": ...}, top_k=10)`` (mem0's hybrid search: its
vector leg and its keyword leg) and ``Memory.add(text, user_id=..., infer=False)`` (no
LLM) with an embedder that answers from the given vectors, so the query embedding costs
nothing on either side. No network: the LLM is configured with a dummy key and never
called.

``--large``: every fact of the engine bench's owner (the two scopes above and its
10,000 scopes of 100, 1,010,500 facts: run ``bench_engine.py --large`` first) goes into
database ``mem0bench_1m``, one mem0 ``user_id`` per scope, by COPY with mem0's indexes
dropped and then built again with its own definitions (``maintenance_work_mem``
``--maintenance-work-mem``); timed: search in the 10,000-fact user and in random
100-fact users, add into one of each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("OPENAI_API_KEY", "sk-offline")
os.environ.setdefault("MEM0_TELEMETRY", "False")

import numpy as np  # noqa: E402
import psycopg  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOCKET = os.environ.get("PG_SOCKET", str(ROOT / ".data" / "pgdata"))
BASE = f"host={SOCKET} port={os.environ.get('PG_PORT', '5432')} user=postgres"
COLLECTION = "bench_facts"
ENGINE_DB = os.environ.get("ENGINE_DB", "bench_engine")
rng = np.random.default_rng(11)
prng = random.Random(11)
VOCAB = [f"w{i}" for i in range(5000)]


def unit() -> list[float]:
    v = rng.standard_normal(384)
    return (v / np.linalg.norm(v)).tolist()


class GivenEmbedder:
    """mem0's embedder interface, answering the vector set for the next call."""

    def __init__(self, config: object) -> None:
        self.config = config
        self.next: list[float] | None = None

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        vector, self.next = self.next, None
        return vector if vector is not None else unit()


def scope_facts(scope: list[str]) -> list[tuple[str, str]]:
    with psycopg.connect(f"{BASE} dbname={ENGINE_DB}") as conn:
        return conn.execute(
            "SELECT v.content, v.embedding::text FROM memories_fact v "
            "JOIN memories_scope s ON s.id = v.scope_id "
            "JOIN auth_user u ON u.id = s.owner_id "
            "WHERE u.username = 'bench-engine' AND s.path = %s",
            [scope],
        ).fetchall()


DB = "mem0bench"


def memory(fresh: bool):
    from mem0 import Memory

    with psycopg.connect(f"{BASE} dbname=postgres", autocommit=True) as conn:
        if fresh:
            conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            conn.execute(f"CREATE DATABASE {DB}")
    config = {
        "vector_store": {
            "provider": "pgvector",
            "config": {
                "connection_string": f"{BASE} dbname={DB}",
                "collection_name": COLLECTION,
                "embedding_model_dims": 384,
                "hnsw": True,
            },
        },
        "llm": {"provider": "openai", "config": {"api_key": "sk-offline"}},
        "embedder": {
            "provider": "openai",
            "config": {"api_key": "sk-offline", "embedding_dims": 384},
        },
        "history_db_path": "/tmp/mem0_bench_history.db",
    }
    m = Memory.from_config(config)
    m.embedding_model = GivenEmbedder(m.embedding_model.config)
    return m


def load(m, user_id: str, facts: list[tuple[str, str]]) -> None:
    """Bulk insert through mem0's vector store with the payload ``Memory.add`` writes."""
    from mem0.utils.lemmatization import lemmatize_for_bm25

    m.vector_store._ensure_collection()  # (mem0 creates its table on first use)
    with psycopg.connect(f"{BASE} dbname={DB}") as conn:
        exists = conn.execute(
            f"SELECT count(*) FROM {COLLECTION} WHERE payload->>'user_id' = %s", [user_id]
        ).fetchone()
    if exists and exists[0] >= len(facts):
        return
    now = datetime.now(UTC).isoformat()
    for start in range(0, len(facts), 1000):
        part = facts[start : start + 1000]
        payloads = [
            {"data": text, "hash": hashlib.md5(text.encode()).hexdigest(), "user_id": user_id,
             "created_at": now, "updated_at": now, "text_lemmatized": lemmatize_for_bm25(text)}
            for text, _ in part
        ]  # fmt: skip
        m.vector_store.insert(
            vectors=[json.loads(vec) for _, vec in part],
            payloads=payloads,
            ids=[str(uuid.uuid4()) for _ in part],
        )
        print(f"  {user_id}: {start + len(part):,}/{len(facts):,}", flush=True)
    with psycopg.connect(f"{BASE} dbname={DB}", autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {COLLECTION}")


def timed(fn, calls: int, warmup: int = 10) -> tuple[float, float, object]:
    for _ in range(warmup):
        fn()
    samples, last = [], None
    for _ in range(calls):
        t = time.perf_counter()
        last = fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return (
        statistics.median(samples),
        samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        last,
    )


def load_large(m, maintenance_work_mem: str) -> None:
    """Every fact of the engine bench's owner, one mem0 user per scope (``big``, ``inj``,
    ``s<i>``), by COPY without mem0's indexes, which are then built again as mem0
    defines them. Skipped when the collection already holds that many rows."""
    m.vector_store._ensure_collection()
    src = psycopg.connect(f"{BASE} dbname={ENGINE_DB}")
    dst = psycopg.connect(f"{BASE} dbname={DB}", autocommit=True)
    total = src.execute(
        "SELECT count(*) FROM memories_fact v JOIN auth_user u ON u.id = v.owner_id "
        "WHERE u.username = 'bench-engine'"
    ).fetchone()[0]
    have = dst.execute(f"SELECT count(*) FROM {COLLECTION}").fetchone()[0]
    if have >= total:
        return
    indexes = dst.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname <> %s",
        [COLLECTION, f"{COLLECTION}_pkey"],
    ).fetchall()
    t0 = time.perf_counter()
    dst.execute(f"TRUNCATE {COLLECTION}")
    for name, _ in indexes:
        dst.execute(f"DROP INDEX {name}")
    now = datetime.now(UTC).isoformat()
    names = {("bench", "big"): "big", ("bench", "inj"): "inj"}
    with (
        src.cursor(name="facts") as cur,
        dst.cursor().copy(f"COPY {COLLECTION} (id, vector, payload) FROM STDIN") as copy,
    ):
        cur.itersize = 20_000
        cur.execute(
            "SELECT v.id, v.embedding::text, v.content, s.path FROM memories_fact v "
            "JOIN memories_scope s ON s.id = v.scope_id "
            "JOIN auth_user u ON u.id = v.owner_id WHERE u.username = 'bench-engine'"
        )
        for n, (vid, vec, text, scope) in enumerate(cur, 1):
            user_id = names.get(tuple(scope)) or f"s{scope[1]}"
            payload = {
                "data": text,
                "hash": hashlib.md5(text.encode()).hexdigest(),
                "user_id": user_id,
                "created_at": now,
                "updated_at": now,
                "text_lemmatized": text,
            }  # fmt: skip (mem0 without spaCy: the text)
            copy.write_row((vid, vec, json.dumps(payload)))
            if n % 200_000 == 0:
                print(f"  copied {n:,}/{total:,} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"  copied {total:,} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    dst.execute(f"SET maintenance_work_mem = '{maintenance_work_mem}'")
    dst.execute("SET max_parallel_maintenance_workers = 1")
    for name, definition in indexes:
        t1 = time.perf_counter()
        dst.execute(definition)
        print(f"  built {name} in {time.perf_counter() - t1:.0f} s", flush=True)
    dst.execute(f"VACUUM ANALYZE {COLLECTION}")
    src.close()
    dst.close()


def main_large(args) -> None:
    global DB
    DB = "mem0bench_1m"
    m = memory(args.fresh)
    load_large(m, args.maintenance_work_mem)
    queries = [(unit(), " ".join(prng.choice(VOCAB) for _ in range(3))) for _ in range(64)]
    smalls = [f"s{i}" for i in range(args.scopes)]
    bench_search(m, ["big"], "10,000 facts (owner holds 1M)", queries, args.queries)
    bench_search(m, smalls, "100 facts (owner holds 1M)", queries, args.queries)
    bench_add(m, "s0", "100 facts (1M)")
    bench_add(m, "big", "10,000 facts (1M)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--large", action="store_true")
    parser.add_argument("--scopes", type=int, default=10_000)
    parser.add_argument("--maintenance-work-mem", default="3GB")
    args = parser.parse_args()
    if args.large:
        main_large(args)
        return
    m = memory(args.fresh)
    big, inj = scope_facts(["bench", "big"]), scope_facts(["bench", "inj"])
    print(f"facts from {ENGINE_DB}: big {len(big):,}, inj {len(inj):,}", flush=True)
    load(m, "big", big)
    load(m, "inj", inj)
    queries = [(unit(), " ".join(prng.choice(VOCAB) for _ in range(3))) for _ in range(64)]
    for user_id, label in (("big", "10,000 facts"), ("inj", "500 facts")):
        bench_search(m, [user_id], label, queries, args.queries)
    for user_id, label in (("inj", "500 facts"), ("big", "10,000 facts")):
        bench_add(m, user_id, label)


def bench_search(m, user_ids: list[str], label: str, queries: list, calls: int) -> None:
    counts = []

    def search() -> object:
        vector, words = prng.choice(queries)
        m.embedding_model.next = vector
        found = m.search(words, filters={"user_id": prng.choice(user_ids)}, top_k=10)
        counts.append(len(found["results"]))
        return found

    p50, p99, _ = timed(search, calls)
    print(f"mem0 search, user of {label:<14} p50 {p50:8.2f} ms  p99 {p99:8.2f} ms  "
          f"rows min {min(counts)} median {statistics.median(counts)}", flush=True)  # fmt: skip


def bench_add(m, user_id: str, label: str) -> None:
    added: list[str] = []

    def add() -> object:
        m.embedding_model.next = unit()
        text = " ".join(prng.choice(VOCAB) for _ in range(8))
        result = m.add(text, user_id=user_id, infer=False)
        added.extend(r["id"] for r in result["results"])
        return result

    p50, p99, _ = timed(add, 50, warmup=5)
    print(f"mem0 add (infer=False), user of {label:<6} p50 {p50:8.2f} ms  p99 {p99:8.2f} ms",
          flush=True)  # fmt: skip
    for memory_id in added:
        m.delete(memory_id)


if __name__ == "__main__":
    main()
