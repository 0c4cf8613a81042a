"""What the date lift costs a search (docs/knowledge.md, "Dates the query names").

LoCoMo dev's questions that name a date (``knowledge.retrieval.dates.periods``), each
searched in process through ``search_chunks`` (hybrid, top 20, the query embedded by the
default embedder) with ``query_dates`` on and off, the two alternated in turn, on the
bases ``bench_retrieval.py`` builds (the chat protocol). Prints the p50 of each and the
median of the paired ratios (on / off): a question that names no date pays only the
parse, a regular expression over its text.

    MEMORY_DATA_DIR=... .venv/bin/python bench/bench_query_dates.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_retrieval as br  # noqa: E402  (sets Django up, on the database bench_retrieval)

from knowledge.retrieval.dates import periods  # noqa: E402
from knowledge.search import SearchRequest, search_chunks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--data", type=Path, default=br.DEFAULT_DATA)
    args = parser.parse_args()
    owner = br.bench_owner("bench-retrieval")
    asked = []
    for conv in br.load(args.data, None):
        kb = br.ensure_base(owner, conv, False)
        asked += [(kb, q.text) for q in conv.questions if periods(q.text)]
    print(f"{len(asked)} questions name a date")

    def timed(kb, text: str, on: bool) -> float:
        request = SearchRequest(query=text, top_k=20, query_dates=on)
        started = time.perf_counter()
        search_chunks(bases=[kb], request=request)
        return (time.perf_counter() - started) * 1000

    for kb, text in asked:  # warm-up: the embedder, the connection, the prepared plans
        timed(kb, text, True), timed(kb, text, False)
    on_ms, off_ms, ratios = [], [], []
    for round_ in range(args.rounds):
        for kb, text in asked:
            order = (True, False) if round_ % 2 == 0 else (False, True)
            took = {on: timed(kb, text, on) for on in order}
            on_ms.append(took[True])
            off_ms.append(took[False])
            ratios.append(took[True] / took[False])
    print(
        f"query_dates on: p50 {statistics.median(on_ms):.2f} ms; off: p50 "
        f"{statistics.median(off_ms):.2f} ms; median of the paired ratios "
        f"{statistics.median(ratios):.3f} ({len(ratios)} pairs)"
    )


if __name__ == "__main__":
    main()
