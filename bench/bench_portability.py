"""Export and import speed of an owner's facts (issue 27): ``--facts`` facts (100,000) with
their vectors (384 dimensions), exported to a file then imported into an empty owner.

    MEMORY_DATA_DIR=... EMBEDDED_DB_NAME=bench_portability .venv/bin/python \\
        bench/bench_portability.py [--facts 100000] [--per-scope 100] [--fresh]

The facts are loaded as ``bench_engine.py`` loads them (binary COPY, random unit vectors,
8-word texts, scopes of ``--per-scope`` facts); the export is ``export_lines`` written to
a file (what ``manage.py export_memory`` and ``GET /api/v1/export`` stream); the import is
``import_lines`` of that file into a new owner (what ``manage.py import_memory`` and
``POST /api/v1/import`` run), with the same embedding model: nothing is embedded again.
Reported: seconds and rows per second of each, the file's size, and that the import wrote
every fact; then the background indexer's time to put the imported facts in the HNSW
index (the import leaves them ``index_pending``, searched exactly meanwhile).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_portability")
sys.argv, _args = sys.argv[:1], sys.argv[1:]  # (bench_engine reads no arguments at import)
import bench.bench_engine as engine_bench  # noqa: E402  (sets Django up)

sys.argv += _args

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from ingestion.portability import export_lines, import_lines  # noqa: E402
from knowledge.services import knowledge_index_pending  # noqa: E402
from memories.facts.models import Fact, Scope  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--per-scope", type=int, default=100)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    if args.fresh:
        users.filter(username__in=["bench-export", "bench-import"]).delete()
    owner, _ = users.get_or_create(username="bench-export")
    have = Fact.objects.filter(owner=owner).count()
    if have < args.facts:
        scopes = [Scope.objects.create(owner=owner, path=["p", str(i)])
                  for i in range(args.facts // args.per_scope)]  # fmt: skip
        print(f"loading {args.facts:,} facts into {len(scopes):,} scopes", flush=True)
        engine_bench.load(owner.pk, [(s.pk, args.per_scope) for s in scopes])
        engine_bench.fix_times()
    users.filter(username="bench-import").delete()
    target = users.create(username="bench-import")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "export.jsonl"
        t0 = time.perf_counter()
        lines = 0
        with path.open("w", encoding="utf-8") as out:
            for line in export_lines(owner=owner):
                out.write(line + "\n")
                lines += 1
        exported = time.perf_counter() - t0
        size = path.stat().st_size / 1e6
        print(f"export: {lines:,} lines, {size:,.0f} MB in {exported:.1f} s "
              f"({lines / exported:,.0f} lines/s)", flush=True)  # fmt: skip
        t0 = time.perf_counter()
        with path.open(encoding="utf-8") as source:
            report = import_lines(owner=target, lines=source,
                                  embedder=engine_bench.FixedEmbedder())  # fmt: skip
        imported = time.perf_counter() - t0
        facts = report.written.get("facts", 0)
        print(f"import: {report.as_dict()} in {imported:.1f} s "
              f"({facts / imported:,.0f} facts/s)", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    run = knowledge_index_pending(table="memories_fact", max_seconds=3600)
    print(f"background indexer: {run.indexed:,} facts into the HNSW index in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    written = Fact.objects.filter(owner=target).count()
    print(f"facts in the target owner: {written:,} (of {have or args.facts:,})", flush=True)


if __name__ == "__main__":
    main()
