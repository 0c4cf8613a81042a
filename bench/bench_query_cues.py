"""What the query's cues cost a search (docs/knowledge.md, "Cues the query names").

LoCoMo dev's questions, each searched in process through ``search_chunks`` (hybrid, top
20, the query embedded by the default embedder) with ``query_cues`` on and off, the two
alternated in turn, on the bases ``bench_retrieval.py`` builds (the chat protocol).
Prints, for every question and for those naming a date or asking when, the p50 of each
and the median of the paired ratios (on / off).

    MEMORY_DATA_DIR=... .venv/bin/python bench/bench_query_cues.py [--rounds 10]
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
from knowledge.search import _ASKS_WHEN, SearchRequest, search_chunks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--data", type=Path, default=br.DEFAULT_DATA)
    args = parser.parse_args()
    owner = br.bench_owner("bench-retrieval")
    asked = []
    for conv in br.load(args.data, None):
        kb = br.ensure_base(owner, conv, False)
        asked += [(kb, q.text) for q in conv.questions]

    def timed(kb, text: str, on: bool) -> float:
        request = SearchRequest(query=text, top_k=20, query_cues=on)
        started = time.perf_counter()
        search_chunks(bases=[kb], request=request)
        return (time.perf_counter() - started) * 1000

    for kb, text in asked:  # warm-up: the embedder, the connection, the prepared plans
        timed(kb, text, True), timed(kb, text, False)
    took: list[tuple[str, float, float]] = []
    for round_ in range(args.rounds):
        for kb, text in asked:
            order = (True, False) if round_ % 2 == 0 else (False, True)
            ms = {on: timed(kb, text, on) for on in order}
            took.append((text, ms[True], ms[False]))
    subsets = (
        ("every question", took),
        ("naming a date", [r for r in took if periods(r[0])]),
        ("asking when", [r for r in took if _ASKS_WHEN.search(r[0])]),
    )
    for title, rows in subsets:
        print(
            f"{title} ({len(rows) // args.rounds}): query_cues on p50 "
            f"{statistics.median(r[1] for r in rows):.2f} ms, off p50 "
            f"{statistics.median(r[2] for r in rows):.2f} ms, median of the paired ratios "
            f"{statistics.median(r[1] / r[2] for r in rows):.3f} ({len(rows)} pairs)"
        )


if __name__ == "__main__":
    main()
