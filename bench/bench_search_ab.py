"""Hybrid search latency, this code against an older search.py, paired query by query.

On a shared, noisy machine two benchmark runs minutes apart differ by more than a code
change does. This runs both versions in one process, on the same data, alternating per
query (which goes first alternates too), so load hits both alike:

    EMBEDDED_DB_NAME=bench EMBEDDING_PROVIDER=hashing .venv/bin/python \\
        bench/bench_search_ab.py --before /path/to/old/checkout [--queries 200]

``--before``: a checkout of the older code; its knowledge search is loaded next to the
current one (``bench/before.py``; the rest of the code is this checkout's). Both run as
the tables' owner, which row-level security exempts: the older search (c246bc8) sends no
owner settings, so the policies would refuse its statements; what the policies cost is
``bench_row_security.py``'s to say.
The data are ``bench_knowledge.py``'s (load them with it first: same ``--chunks`` and
seed); the scenarios and queries are its five. Printed per scenario: hybrid top-10 p50
and p95 of each version, the ratio of the p50s and the median of the per-query ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_knowledge as bk  # noqa: E402  (sets Django up, EMBEDDED_DB_NAME=bench)
from before import load_before  # noqa: E402

from knowledge import search as current  # noqa: E402


def timed(module: Any, query: bk.Query) -> float:
    request = module.SearchRequest(
        query=query.text,
        vector=[float(x) for x in query.vector],
        top_k=10,
        mode="hybrid",
        filters={} if query.session is None else {"session_id": query.session},
    )
    started = time.perf_counter()
    module.search_chunks(bases=query.bases, request=request)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--query-noise", type=float, default=0.5)
    args = parser.parse_args()
    specs = bk.plan_bases(args.chunks, args.seed)
    if not bk.existing_data_matches(specs, bk._marker(args.chunks, args.seed, 1.0)):
        raise SystemExit("no matching data: load it with bench_knowledge.py --chunks first")
    bk.bench_db.connect_as_tables_owner()
    before = load_before(args.before)
    corpus = bk.Corpus(args.seed, 1.0)
    print(f"hybrid top-10, ms; before = {args.before}; {args.queries} paired queries")
    print(
        f"{'scenario':36} {'before p50':>10} {'after p50':>10} {'ratio':>6} "
        f"{'paired':>6} {'before p95':>10} {'after p95':>10}"
    )
    for scenario in bk.build_scenarios(specs):
        queries = bk.make_queries(scenario, corpus, args.queries, args.seed, args.query_noise)
        for query in queries[: args.warmup]:
            timed(before, query), timed(current, query)
        a, b = [], []
        for i, query in enumerate(queries):
            if i % 2:
                a.append(timed(before, query))
                b.append(timed(current, query))
            else:
                b.append(timed(current, query))
                a.append(timed(before, query))
        pa, pb = statistics.median(a), statistics.median(b)
        paired = statistics.median(y / x for x, y in zip(a, b))
        print(
            f"{scenario.name:36} {pa:10.2f} {pb:10.2f} {pb / pa:6.2f} {paired:6.2f} "
            f"{bk.pct(a, 95):10.2f} {bk.pct(b, 95):10.2f}"
        )


if __name__ == "__main__":
    main()
