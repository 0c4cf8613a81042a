"""Throughput of the offline all-MiniLM-L6-v2 embedder (core.providers.local_minilm).

Run from the repository root:

    .venv/bin/python bench/bench_local_embedder.py [--sentences 500] [--runs 3] [--batch-size 32]

Prints the ONNX graph build time (fresh, empty cache dir), the time to load the
cached graph, and sentences/second for each backend (median of --runs runs over
the same ~500 memory-like sentences of 8-60 words).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.providers.local_minilm import MiniLMEncoder  # noqa: E402

_SUBJECTS = [
    "The user",
    "My manager",
    "Alice",
    "Our team",
    "The customer from Berlin",
    "My sister",
    "The on-call engineer",
    "Dr. Martínez",
    "The new intern",
    "Our landlord",
]
_FACTS = [
    "prefers dark mode in every editor and wants keyboard shortcuts documented",
    "is allergic to peanuts and shellfish, so restaurant suggestions must avoid them",
    "moved the quarterly planning meeting to Thursday at 10:30 in room 4B",
    "asked for the invoice #2024-118 to be re-sent with the corrected VAT number",
    "is training for a half marathon in October and runs three times a week",
    "uses PostgreSQL 16 with pgvector for the analytics side project",
    "wants weekly summaries on Monday mornings instead of daily notifications",
    "said the deployment failed because the migration locked the orders table",
    "is learning Japanese and practises kanji for twenty minutes every evening",
    "booked flights to Lisbon for the 14th and needs a hotel near the conference venue",
    "reported that search results are slow when the query contains accented characters",
    "recommended reading 'Designing Data-Intensive Applications' before the architecture review",
]
_TAILS = [
    "",
    "",
    "",
    " This came up again during yesterday's call, and it should be taken into account"
    " for future suggestions.",
    " Remember to double-check this before making any commitments on their behalf.",
    " They mentioned it twice, so it is probably important to them, even if it sounds"
    " like a small detail.",
    " It was said in passing while discussing the budget for next year, which is still"
    " not approved, and the"
    " finance team expects a revised proposal with detailed estimates by the end of the month.",
]


def make_sentences(n: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(_SUBJECTS)} {rng.choice(_FACTS)}.{rng.choice(_TAILS)}" for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--backends", default="onnx,numpy")
    args = ap.parse_args()

    sentences = make_sentences(args.sentences)
    words = [len(s.split()) for s in sentences]
    print(
        f"cpu_count={os.cpu_count()} sentences={len(sentences)} words/sentence: "
        f"mean={statistics.mean(words):.1f} min={min(words)} max={max(words)} "
        f"batch_size={args.batch_size}"
    )

    with tempfile.TemporaryDirectory(prefix="minilm-bench-") as tmp:
        cache = Path(tmp)
        for backend in args.backends.split(","):
            t0 = time.perf_counter()
            enc = MiniLMEncoder(cache_dir=cache, backend=backend).load()
            load_s = time.perf_counter() - t0
            if backend == "onnx":
                print(
                    f"[onnx]  graph build: {enc.graph_build_seconds:.2f}s "
                    f"(first load incl. build + session: {load_s:.2f}s, "
                    f"{enc.graph_path.stat().st_size / 1e6:.1f} MB)"
                )
                t0 = time.perf_counter()
                enc = MiniLMEncoder(cache_dir=cache, backend=backend).load()
                assert not enc.graph_built
                print(f"[onnx]  load from cached graph: {time.perf_counter() - t0:.2f}s")
            else:
                print(f"[{backend}] load: {load_s:.2f}s")
            enc.encode(sentences[:16], batch_size=args.batch_size)  # warm-up
            rates = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                enc.encode(sentences, batch_size=args.batch_size)
                rates.append(len(sentences) / (time.perf_counter() - t0))
            print(
                f"[{enc.backend}] {statistics.median(rates):.1f} sentences/s "
                f"(median of {args.runs}; runs: {', '.join(f'{r:.1f}' for r in rates)})"
            )


if __name__ == "__main__":
    main()
