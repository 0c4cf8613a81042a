"""Ingestion with the scoped text index (knowledge 0012) against the plain one it replaced.

    EMBEDDED_DB_NAME=bench EMBEDDING_PROVIDER=hashing .venv/bin/python \\
        bench/bench_text_index_ingest.py [--chunks 5000] [--rounds 2]

On ``bench_knowledge.py``'s database (load it first), each round ingests ``--chunks``
chunks into a probe base (``bench_knowledge.probe_ingest``: precomputed vectors, batches
of 1,000, HNSW maintained) twice: once with only the plain GIN index on
``search_vector``, once with only ``chunk_scoped_text_gin``, the other index dropped for
the run and rebuilt after it, the probe base deleted. Printed: chunks/s of each run.
Leaves both indexes in place (the plain one serves an older checkout's keyword leg in
``bench_search_ab.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_knowledge as bk  # noqa: E402  (sets Django up, EMBEDDED_DB_NAME=bench)
from django.db import connection  # noqa: E402

from knowledge import bm25  # noqa: E402
from knowledge.services import knowledge_base_delete  # noqa: E402

INDEXES = {
    "plain": ("chunk_search_vector_gin", "gin (search_vector)"),
    "scoped": ("chunk_scoped_text_gin", f"gin ({bm25.SCOPED_TEXT})"),
}


def ensure(name: str) -> None:
    index, definition = INDEXES[name]
    with connection.cursor() as cur:
        cur.execute("SET maintenance_work_mem = '512MB'")
        cur.execute(f"CREATE INDEX IF NOT EXISTS {index} ON knowledge_chunk USING {definition}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    corpus = bk.Corpus(args.seed, 1.0)
    for _ in range(args.rounds):
        for only, other in (("plain", "scoped"), ("scoped", "plain")):
            ensure(only)
            with connection.cursor() as cur:
                cur.execute(f"DROP INDEX IF EXISTS {INDEXES[other][0]}")
            started = time.perf_counter()
            _, kb = bk.probe_ingest(corpus, args.seed, args.chunks, 1000, bk.DIMS)
            rate = args.chunks / (time.perf_counter() - started)
            knowledge_base_delete(knowledge_base=kb)
            ensure(other)
            print(f"{only:6} text index only: {rate:,.0f} chunks/s", flush=True)


if __name__ == "__main__":
    main()
