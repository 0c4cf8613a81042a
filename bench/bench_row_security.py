"""What row-level security costs the searches: the same query with the policies on and
off, paired query by query in one process.

"On" is how the service runs: the service's role (``memory_app``, subject to the
policies) with the owner's settings sent with each transaction (``core.tenancy``).
"Off" is the tables' owner (``postgres``, which PostgreSQL exempts from the policies)
on a second connection to the same database, with no settings sent: the code before
row-level security. Each query runs both ways, which goes first alternating, so the
machine's load hits both alike. Printed per case: p50 and p95 of each, the ratio of the
p50s and the median of the per-query ratios.

    MEMORY_DATA_DIR=/work/benchdata EMBEDDED_DB_NAME=bench EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_row_security.py knowledge --queries 200
    MEMORY_DATA_DIR=/work/benchdata EMBEDDED_DB_NAME=bench_engine EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_row_security.py engine --queries 200

``knowledge``: ``bench_knowledge.py``'s 100,000 chunks and its five hybrid scenarios
(load them with it first). ``engine``: ``bench_engine.py``'s owner ``bench-engine``
(its scope of 10,000 facts and scopes of 100, loaded here into a database without
them: ``--small-scopes``, default 100; on ``bench_engine.py --large``'s database its
1,000,000 facts), hybrid ``fact_search`` in the 10,000-fact scope and in the small ones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")

OFF = "table_owner"


def _setup() -> None:
    import django

    django.setup()
    from django.db import connections

    from core import tenancy

    tenancy.set_fallback(("", "bench"))  # building and looking up: every owner's rows
    entry = dict(connections.settings["default"])
    entry["USER"] = entry["OWNER_USER"]
    entry["EMBEDDED"] = dict(entry["EMBEDDED"])
    connections.settings[OFF] = entry


def run_as(mode: str, owner_id: int, fn: Callable[[], Any]) -> float:
    """``fn``'s milliseconds with the policies on (the service) or off (the owner's
    connection, reads routed to it as a replica's would be)."""
    from core import tenancy

    if mode == "on":
        with tenancy.as_owner(owner_id):
            started = time.perf_counter()
            fn()
            return (time.perf_counter() - started) * 1000
    with owners_reads(), tenancy.bypass("bench: policies off"):
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1000


@contextmanager
def owners_reads() -> Iterator[None]:
    """The bench's own look-ups (its data, its scenarios), through the owner's connection."""
    from core import replicas

    token = replicas._reads.set(replicas._Reads(read_only=True, alias=OFF))
    try:
        yield
    finally:
        replicas._reads.reset(token)


def paired(label: str, cases: list[tuple[int, Callable[[], Any]]], warmup: int) -> None:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    for owner_id, fn in cases[:warmup]:
        run_as("on", owner_id, fn)
        run_as("off", owner_id, fn)
    on, off = [], []
    with CaptureQueriesContext(connections["default"]) as stray:
        for i, (owner_id, fn) in enumerate(cases):
            first, second = ("on", "off") if i % 2 == 0 else ("off", "on")
            took = {first: run_as(first, owner_id, fn)}
            took[second] = run_as(second, owner_id, fn)
            on.append(took["on"])
            off.append(took["off"])
    # (the "off" runs' statements on the service's connection: 0 if "off" is all off)
    stray_off = sum(1 for q in stray.captured_queries if "memory.bypass', 'on'" in q["sql"])
    ratios = [a / b for a, b in zip(on, off)]
    print(
        f"{label:<44} off p50 {statistics.median(off):7.2f} p95 {_p95(off):7.2f} | "
        f"on p50 {statistics.median(on):7.2f} p95 {_p95(on):7.2f} | "
        f"p50 ratio {statistics.median(on) / statistics.median(off):.3f} "
        f"median of ratios {statistics.median(ratios):.3f} (n={len(on)}, stray {stray_off})",
        flush=True,
    )


def _p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))]


def knowledge(args: argparse.Namespace) -> None:
    import bench_knowledge as bk

    specs = bk.plan_bases(args.chunks, args.seed)
    with owners_reads():
        if not bk.existing_data_matches(specs, bk._marker(args.chunks, args.seed, 1.0)):
            raise SystemExit("no matching data: load it with bench_knowledge.py --chunks first")
        scenarios = bk.build_scenarios(specs)
    corpus = bk.Corpus(args.seed, 1.0)
    for scenario in scenarios:
        queries = bk.make_queries(scenario, corpus, args.queries, args.seed, 0.5)
        cases = [(q.bases[0].owner_id, (lambda q=q: bk.run_search(q, "hybrid"))) for q in queries]
        paired(scenario.name, cases, args.warmup)


def engine(args: argparse.Namespace) -> None:
    import random

    import bench_engine as be
    from django.db import connection

    from core.db_backend.base import table_owner
    from memories.facts.models import Scope
    from memories.facts.scopes import scope_ensure
    from memories.facts.search import fact_search

    owner, _ = be.get_user_model().objects.get_or_create(username="bench-engine")
    big = scope_ensure(owner=owner, scope=("bench", "big"))
    smalls = [scope_ensure(owner=owner, scope=("s", str(i))) for i in range(args.small_scopes)]
    if not big.links.exists():  # bench_engine.py's facts (COPY: the tables' owner's)
        with table_owner(connection):
            be.load(owner.pk, [(big.pk, 10_000)] + [(s.pk, 100) for s in smalls])
    rng = random.Random(args.seed)
    queries = [(be.unit(1)[0], " ".join(rng.choice(be.VOCAB) for _ in range(3))) for _ in range(64)]

    def cases(rows: list[Scope]) -> list[tuple[int, Callable[[], Any]]]:
        out = []
        for _ in range(args.queries):
            q, words = rng.choice(queries)
            row = rng.choice(rows)
            out.append(
                (
                    owner.pk,
                    lambda q=q, words=words, row=row: fact_search(
                        owner=owner,
                        scope=row,
                        query=words,
                        limit=10,
                        query_vector=q,
                        embedder=be.FixedEmbedder(),
                    ),
                )  # fmt: skip
            )
        return out

    held = 10_000 + 100 * len(smalls)
    paired(f"engine: 10k-fact scope, owner holds {held:,}", cases([big]), args.warmup)
    paired(f"engine: 100-fact scopes, owner holds {held:,}", cases(smalls), args.warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["knowledge", "engine"])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--small-scopes", type=int, default=100, help="engine, a fresh database")
    args = parser.parse_args()
    _setup()
    from django.core.management import call_command

    if not os.environ.get("NO_MIGRATE"):  # (the owner columns, on data loaded before them)
        call_command("migrate", verbosity=0)
    {"knowledge": knowledge, "engine": engine}[args.what](args)


if __name__ == "__main__":
    main()
