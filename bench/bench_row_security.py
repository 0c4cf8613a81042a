"""What row-level security costs the searches: the same query with the policies on and
off, paired query by query in one process.

"On" is how the service runs: the service's role (``memory_app``, subject to the
policies) with the owner's settings sent with each transaction (``core.tenancy``).
"Off" is the tables' owner (``postgres``, which PostgreSQL exempts from the policies)
on a second connection to the same database, with no settings sent: the code before
row-level security; with ``--off bypassrls``, a role with the service's privileges that
the policies exempt (``BYPASSRLS``, not a superuser: what the policies alone cost). Each
query runs both ways, which goes first alternating, so the
machine's load hits both alike. Printed per case: p50 and p95 of each, the ratio of the
p50s and the median of the per-query ratios.

    MEMORY_DATA_DIR=/work/benchdata EMBEDDED_DB_NAME=bench EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_row_security.py knowledge --queries 200
    MEMORY_DATA_DIR=/work/benchdata EMBEDDED_DB_NAME=bench_engine EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_row_security.py engine --queries 200

    MEMORY_DATA_DIR=/work/benchdata EMBEDDED_DB_NAME=bench_chat EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_row_security.py chat --queries 300

``knowledge``: ``bench_knowledge.py``'s 100,000 chunks and its five hybrid scenarios
(load them with it first). ``engine``: ``bench_engine.py``'s owner ``bench-engine``
(its scope of 10,000 facts and scopes of 100, loaded here for the scopes that have
none: ``--small-scopes``, default 100; on ``bench_engine.py --large``'s database its
1,000,000 facts), hybrid ``fact_search`` in the 10,000-fact scope and in the small ones.
``chat``: ``bench_chat_proxy.py``'s request with retrieval (``POST /v1/chat/completions``
with a ``user`` of 200 facts, through the whole Django stack, to a scripted upstream on
127.0.0.1), the request's connection swapped between the service's role and the
tables' owner: the whole request's time, the upstream's and the query embedding's
included.
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


# ``--off bypassrls``: "off" is this role instead of the tables' owner: not a superuser,
# the service role's privileges, but exempt from the policies (BYPASSRLS). It tells what
# the policies cost apart from what the change of role costs (a superuser skips every
# privilege check of a statement's functions and tables).
NO_POLICIES_ROLE = "memory_bench_bypassrls"


def _setup(off: str) -> None:
    import django

    django.setup()
    from django.db import connections

    from core import tenancy

    tenancy.set_fallback(("", "bench"))  # building and looking up: every owner's rows
    entry = dict(connections.settings["default"])
    service_role = entry["USER"]
    entry["USER"] = entry["OWNER_USER"]
    entry["EMBEDDED"] = dict(entry["EMBEDDED"])
    if off == "bypassrls":
        connections.settings["_owner"] = dict(entry)
        with connections["_owner"].cursor() as cur:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [NO_POLICIES_ROLE])
            if cur.fetchone() is None:
                cur.execute(
                    f"CREATE ROLE {NO_POLICIES_ROLE} LOGIN BYPASSRLS IN ROLE {service_role}"
                )
        connections["_owner"].close()
        entry["USER"] = NO_POLICIES_ROLE
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

    from memories.facts.models import Fact, Scope
    from memories.facts.scopes import scope_ensure
    from memories.facts.search import fact_search

    owner, _ = be.get_user_model().objects.get_or_create(username="bench-engine")
    big = scope_ensure(owner=owner, scope=("bench", "big"))
    smalls = [scope_ensure(owner=owner, scope=("s", str(i))) for i in range(args.small_scopes)]
    # bench_engine.py's facts (by COPY, as the tables' owner), for the scopes that have
    # none: on bench_engine.py's own database the big scope is there and the small ones
    # are not (they were timed empty). Then the planner's statistics, or the first
    # searches are planned blind.
    todo = [(big.pk, 10_000)] if not big.links.exists() else []
    todo += [(s.pk, 100) for s in smalls if not s.links.exists()]
    if todo:
        be.load(owner.pk, todo)
        be.fix_times()
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

    with owners_reads():  # (the table's rows: 20,100 loaded here, 1,010,500 by --large)
        held = Fact.objects.using(OFF).count()
    paired(f"engine: 10k-fact scope, {held:,} facts", cases([big]), args.warmup)
    paired(f"engine: 100-fact scopes, {held:,} facts", cases(smalls), args.warmup)


def chat(args: argparse.Namespace) -> None:
    import bench_chat_proxy as bc
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.test import Client
    from django_q.models import OrmQ

    from core.services import api_key_create
    from memories.facts.scopes import end_user_ensure
    from memories.facts.services import FactIn, fact_add
    from tests.fakes.openai_server import FakeOpenAIServer, Scripted, chat_body

    server = FakeOpenAIServer().start()
    server.serve_as_llm(settings)
    settings.MEMORY_SCORE_THRESHOLD = 0.1  # (the hashing embedder: let facts be injected)
    owner, _ = get_user_model().objects.get_or_create(username="bench-chat")
    end_user = end_user_ensure(owner=owner, external_id="bench-user")
    if not end_user.links.exists():
        facts = [FactIn(f"User likes {bc.TOPICS[i % len(bc.TOPICS)]} (fact {i})")
                 for i in range(200)]  # fmt: skip
        fact_add(owner=owner, scope=end_user, facts=facts, dedup_threshold=1.01, reason="bench")
    _, key = api_key_create(owner=owner, name="bench-rls")
    server.default_chat = Scripted(body=chat_body("Sure, here is an answer. " * 8))
    body = {
        "model": "fake-model",
        "user": "bench-user",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "What should I do this weekend? I like hiking."},
        ],
    }
    client = Client()
    wrappers = {"on": connections["default"], "off": connections[OFF]}

    def request(mode: str, owner_id: int) -> float:
        connections["default"] = wrappers[mode]  # (this thread's: the request's)
        started = time.perf_counter()
        response = client.post(
            "/v1/chat/completions", body, content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {key}",
        )  # fmt: skip
        took = (time.perf_counter() - started) * 1000
        assert response.status_code == 200 and response.json()["memories"], response.content
        return took

    for _ in range(args.warmup):
        request("on", owner.pk), request("off", owner.pk)
    on, off = [], []
    for i in range(args.queries):
        first, second = ("on", "off") if i % 2 == 0 else ("off", "on")
        took = {first: request(first, owner.pk)}
        took[second] = request(second, owner.pk)
        on.append(took["on"])
        off.append(took["off"])
    connections["default"] = wrappers["on"]
    ratios = [a / b for a, b in zip(on, off)]
    print(
        f"{'chat with retrieval, 200 facts':<44} off p50 {statistics.median(off):7.2f} "
        f"p95 {_p95(off):7.2f} | on p50 {statistics.median(on):7.2f} p95 {_p95(on):7.2f} | "
        f"p50 ratio {statistics.median(on) / statistics.median(off):.3f} "
        f"median of ratios {statistics.median(ratios):.3f} (n={len(on)})",
        flush=True,
    )
    server.stop()
    with owners_reads():  # (the formation tasks the requests queued: no worker here)
        OrmQ.objects.using(OFF).all().delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["knowledge", "engine", "chat"])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--small-scopes", type=int, default=100, help="engine, a fresh database")
    parser.add_argument(
        "--off",
        choices=["owner", "bypassrls"],
        default="owner",
        help="off: the tables' owner (a superuser: the code before row-level security), or "
        "a role with the service's privileges exempt from the policies",
    )
    args = parser.parse_args()
    if args.what == "chat":  # (as bench_chat_proxy.py: its requests, none throttled)
        os.environ["CONN_MAX_AGE"] = "60"
        os.environ["CHAT_THROTTLE_RATE"] = "1000000/minute"
    _setup(args.off)
    from django.core.management import call_command

    if not os.environ.get("NO_MIGRATE"):  # (the owner columns, on data loaded before them)
        call_command("migrate", verbosity=0)
    {"knowledge": knowledge, "engine": engine, "chat": chat}[args.what](args)


if __name__ == "__main__":
    main()
