"""Hybrid search over one long document: context within a document finds a hit's
neighbours among that document's chunks (issue 25), through the index on (base, document
key, chunk index, id).

    EMBEDDED_DB_NAME=bench_lane EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_document_context.py [--chunks 2000] [--queries 60]

One base, one document of about ``--chunks`` chunks (25 random words per sentence, chunk
size 200 characters), kept between runs; ``--queries`` three-word queries, hybrid,
top_k 10, in process; p50 and p95 printed, twice.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDING_PROVIDER", "hashing")
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_lane")

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.search import SearchRequest, search_chunks  # noqa: E402
from knowledge.services import DocumentIn, knowledge_base_create, knowledge_base_ingest  # noqa: E402


def base(chunks: int) -> KnowledgeBase:
    owner, _ = get_user_model().objects.get_or_create(username="lane")
    name = f"one document, {chunks} chunks"
    kb = KnowledgeBase.objects.filter(owner=owner, name=name).first()
    if kb is None:
        kb = knowledge_base_create(owner=owner, name=name, chunk_size=200, chunk_overlap=0)
        rng = random.Random(1)
        words = [f"w{i}" for i in range(3000)]
        sentences = int(chunks * 1.4)  # (about 0.7 chunk per 25-word sentence)
        text = ". ".join(" ".join(rng.choices(words, k=25)) for _ in range(sentences))
        knowledge_base_ingest(
            knowledge_base=kb, documents=[DocumentIn(text=text, source_key="doc")]
        )
        kb.refresh_from_db()
    return kb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=60)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    kb = base(args.chunks)
    queries = [f"w{i} w{i + 7} w{i + 13}" for i in range(0, 10 * args.queries, 10)]
    print(f"{kb.chunk_count} chunks in one document; {len(queries)} hybrid searches, top_k 10")
    for _ in range(2):
        times = []
        for query in queries:
            started = time.perf_counter()
            search_chunks(bases=[kb], request=SearchRequest(query=query, top_k=10))
            times.append((time.perf_counter() - started) * 1000)
        p95 = sorted(times)[int(0.95 * len(times))]
        print(f"  p50 {statistics.median(times):.1f} ms, p95 {p95:.1f} ms")


if __name__ == "__main__":
    main()
