"""Memory engine benchmark: core-fact search, injection and adds (service-side, no HTTP).

Run from the repository root, against a private database (reused between runs):

    EMBEDDED_DB_NAME=bench_engine .venv/bin/python bench/bench_engine.py [--fresh] \\
        [--scopes 10000 --per-scope 100] [--queries 200] [--skip-large | --large] \\
        [--search-only] [--maintenance-work-mem 3GB] [--history 5]

Data (one owner): scope ``["bench", "big"]`` with 10,000 facts, ``["bench", "inj"]``
with 500, then (unless ``--skip-large``) 10,000 scopes ``["s", "<i>"]`` of 100 facts
(1M facts), rows of all scopes interleaved in the table as a busy service writes them;
the 1M are loaded with the HNSW indexes dropped, which are then built again (one
``CREATE INDEX`` each, ``maintenance_work_mem`` from ``--maintenance-work-mem``, one
parallel worker). ``--large``: the 1M phase only (phase A's figures skipped).
Vectors: random unit vectors, 384 dimensions, loaded with binary COPY; texts: 8 words
drawn from a 5,000-word vocabulary. Queries are random unit vectors (the query
embedding is excluded from every timing) with 3 vocabulary words as text.

Reported (p50/p99 over ``--queries`` calls, after 10 warm-up calls):

* search: ``fact_search`` hybrid, limit 10, decay on, in the 10k scope and in
  100-fact scopes; rows returned (must be min(10, matching));
* "before": the personal-memory search as it was (exact cosine over every fact of
  the owner, filtered by an EXISTS on the user's links), same scopes, fewer calls;
* injection: ``format_for_injection`` over the 500-fact scope, 600 tokens, without
  and with a query;
* the duplicate check alone (the scope's nearest fact);
* add: ``fact_add`` of one new fact (embedding precomputed) into a 100-fact and
  the 10,000-fact scope (dedup checks included), then removed again.

``--history N`` (issue 27): before phase A, every fact of the owner is edited N times
(N + 1 versions each; once per database: a database already edited is not edited
again), by the write service's own statements in bulk: each round closes every fact's
version into ``memories_factversion`` (the INSERT ... SELECT of ``services._CLOSE``) and
changes its text in place (its words rotated: the same lexemes, another order), one
hour apart; then phase A also times a search ``as_of`` the middle round. Compare with a
copy of the same database without ``--history`` (``CREATE DATABASE b TEMPLATE a`` before
the edits), alternated.

To compare two versions of the code, run each checkout's copy of this script in turn
on a copy of the same database (``CREATE DATABASE ... TEMPLATE``), several times each,
alternated: the machine's load then hits both alike.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from pgvector.psycopg import register_vector  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_engine")

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from core.db_backend.base import table_owner  # noqa: E402
from core.providers.tokens import count_tokens  # noqa: E402
from memories.facts.injection import format_for_injection  # noqa: E402
from memories.facts.models import Scope  # noqa: E402
from memories.facts.scopes import scope_ensure  # noqa: E402
from memories.facts.search import fact_search  # noqa: E402
from memories.facts.services import FactIn, fact_add, fact_delete  # noqa: E402

DIMS = 384
MODEL = settings.EMBEDDING_MODEL
VOCAB = [f"w{i}" for i in range(5000)]
rng = np.random.default_rng(7)
prng = random.Random(7)


def unit(n: int) -> np.ndarray:
    m = rng.standard_normal((n, DIMS)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


class FixedEmbedder:
    provider, model, dimensions = "bench", MODEL, DIMS

    def __init__(self) -> None:
        self.next: np.ndarray | None = None

    def embed(self, texts: Any) -> np.ndarray:
        return unit(len(texts))


def text() -> str:
    return " ".join(prng.choice(VOCAB) for _ in range(8))


def load(owner_id: int, scopes: list[tuple[int, int]]) -> None:
    """COPY facts for [(scope row id, count)], rows of all scopes interleaved, as the
    tables' owner (PostgreSQL refuses COPY FROM into a table whose policies hold)."""
    with table_owner(connection):
        _load(owner_id, scopes)


def _load(owner_id: int, scopes: list[tuple[int, int]]) -> None:
    order = np.concatenate([np.full(n, sid, dtype=np.int64) for sid, n in scopes])
    rng.shuffle(order)
    total, t0 = len(order), time.perf_counter()
    now = datetime.now(UTC)
    batch = 50_000
    with connection.cursor() as cur:
        pg = cur.connection
        register_vector(pg)
        for start in range(0, total, batch):
            part = order[start : start + batch]
            vecs = unit(len(part))
            ids = [uuid.uuid4() for _ in part]
            with pg.cursor().copy(
                "COPY memories_fact (id, owner_id, content, normalized, tokens, embedding, "
                "embedding_model, dimensions, metadata, observed_at, created_at, updated_at, "
                "scope_id, category, confidence, source_kind, source_ref) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(
                    ["uuid", "integer", "text", "text", "integer", "vector", "varchar", "smallint",
                     "jsonb", "timestamptz", "timestamptz", "timestamptz", "bigint", "varchar",
                     "double precision", "varchar", "varchar"]
                )  # fmt: skip
                for vid, sid, vec in zip(ids, part, vecs, strict=True):
                    content = text()
                    at = now - timedelta(days=prng.uniform(0, 120))
                    category = prng.choice(["preference", "knowledge", "context", "goal"])
                    confidence = round(prng.uniform(0.7, 1.0), 3)
                    # (the tokens of its injection line, as the write service counts them)
                    tokens = count_tokens(f"- [{category} | {confidence:.2f}] {content}")
                    copy.write_row(
                        (vid, owner_id, content, content, tokens, vec, MODEL, DIMS, Jsonb({}),
                         at, at, at, int(sid), category, confidence, "import", "")
                    )  # fmt: skip
            with pg.cursor().copy(
                "COPY memories_factlink (scope_id, fact_id, shared, created_at) FROM STDIN"
            ) as copy:
                for vid, sid in zip(ids, part, strict=True):
                    copy.write_row((int(sid), vid, False, now))
            pg.commit()
            done = start + len(part)
            print(
                f"  loaded {done:,}/{total:,} facts ({time.perf_counter() - t0:.0f} s)", flush=True
            )


def without_hnsw(maintenance_work_mem: str) -> Callable[[], None]:
    """Drop the fact table's HNSW indexes (a COPY of 1M rows would pay an insert into
    each graph per row); returns the function that builds them again. As the tables'
    owner (their indexes are its)."""
    with table_owner(connection), connection.cursor() as cur:
        cur.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'memories_fact' "
            "AND indexdef LIKE '%USING hnsw%'"
        )
        indexes = cur.fetchall()
        for name, _ in indexes:
            cur.execute(f"DROP INDEX {name}")

    def build() -> None:
        with table_owner(connection), connection.cursor() as cur:
            cur.execute(
                "SELECT set_config('maintenance_work_mem', %s, false)", [maintenance_work_mem]
            )
            cur.execute("SET max_parallel_maintenance_workers = 1")
            for name, definition in indexes:
                t0 = time.perf_counter()
                cur.execute(definition)
                print(f"  built {name} in {time.perf_counter() - t0:.0f} s", flush=True)
            cur.execute("RESET maintenance_work_mem")

    return build


def fix_times() -> None:
    with table_owner(connection), connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE memories_fact")
        cur.execute("VACUUM ANALYZE memories_factlink")
        cur.execute("SELECT to_regclass('memories_fact_half') IS NOT NULL")
        if cur.fetchone()[0]:  # (the 16-bit copies, migration 0008)
            cur.execute("VACUUM ANALYZE memories_fact_half")


def timed(fn: Callable[[], Any], calls: int, warmup: int = 10) -> tuple[float, float, Any]:
    for _ in range(warmup):
        fn()
    samples, last = [], None
    for _ in range(calls):
        t = time.perf_counter()
        last = fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return statistics.median(samples), p99, last


OLD_SEARCH = (
    "SELECT id, embedding <=> %s::vector AS d FROM memories_fact v "
    "WHERE owner_id = %s AND embedding_model = %s AND dimensions = %s AND EXISTS ("
    "SELECT 1 FROM memories_factlink uv WHERE uv.scope_id = %s AND uv.fact_id = v.id) "
    "ORDER BY d, id LIMIT 10"
)


def old_search(owner_id: int, scope_id: int, q: np.ndarray) -> list[Any]:
    with connection.cursor() as cur:
        cur.execute(
            OLD_SEARCH, ["[" + ",".join(map(str, q)) + "]", owner_id, MODEL, DIMS, scope_id]
        )
        return cur.fetchall()


def explain(label: str, scope: Scope, q: np.ndarray, words: str = "w1 w2 w3") -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the search's statement and of the duplicate check's
    nearest-fact lookup for one scope: what each reads."""
    from knowledge.retrieval.db import fetch
    from knowledge.retrieval.engine import Ranking, statement
    from memories.facts import search

    vector = q.tolist()
    legs = (
        search.fact_vector_leg(scope, vector, MODEL, search._vector_pool(10, 0)),
        search.fact_keyword_leg(scope, words, search._pool(10, 0)),
    )
    ranking = Ranking(limit=10, half_life=search.HALF_LIFE_DAYS, now=datetime.now(UTC))
    one = statement(search.FACTS, *legs, ranking)
    nearest = search.fact_vector_leg(scope, vector, MODEL, 1)
    for name, sql, params, local in (
        ("search, the one statement", one.sql, one.params, one.local),
        ("duplicate check (nearest fact)", nearest.sql, nearest.params, nearest.local),
    ):
        plan, _ = fetch("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params, False, local)
        print(f"  EXPLAIN {name}, {label}:")
        for (line,) in plan:
            print("    " + line)


def report(label: str, p50: float, p99: float, extra: str = "") -> None:
    print(f"{label:<62} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms  {extra}", flush=True)


def edit_history(owner_id: int, rounds: int) -> Any:
    """Every fact of the owner edited ``rounds`` times (see the module); returns the
    time of the middle round's versions, to search as of it."""
    from memories.facts.timeline import At

    with connection.cursor() as cur:
        cur.execute("SELECT max(recorded_to) FROM memories_factversion WHERE owner_id = %s",
                    [owner_id])  # fmt: skip
        done = cur.fetchone()[0]
        start = datetime.now(UTC) - timedelta(hours=rounds + 1)
        if done is None:
            for r in range(rounds):
                at = start + timedelta(hours=r + 1)
                t0 = time.perf_counter()
                cur.execute(CLOSE_ALL, [at, at, owner_id])
                cur.execute(EDIT_ALL, [at, at, owner_id])
                print(f"  edit round {r + 1}: {time.perf_counter() - t0:.1f} s", flush=True)
            cur.execute("VACUUM ANALYZE memories_factversion")
            fix_times()
            done = start + timedelta(hours=rounds)
        cur.execute("SELECT count(*) FROM memories_factversion WHERE owner_id = %s", [owner_id])
        print(f"  {cur.fetchone()[0]:,} closed versions", flush=True)
    return At(as_of=done - timedelta(hours=rounds // 2, minutes=30))


# The write service's close (``memories.facts.services._CLOSE``) and an edit in place, for
# every fact of an owner at once.
CLOSE_ALL = (
    "INSERT INTO memories_factversion (id, fact_id, owner_id, scope_id, content, category, "
    "confidence, source_kind, source_ref, metadata, embedding, embedding_model, dimensions, "
    "tokens, observed_at, valid_from, valid_to, recorded_from, recorded_to, created_at, "
    "updated_at, successor_id, action, reason, source, superseded) "
    "SELECT gen_random_uuid(), f.id, f.owner_id, f.scope_id, f.content, f.category, "
    "f.confidence, f.source_kind, f.source_ref, f.metadata, f.embedding, f.embedding_model, "
    "f.dimensions, f.tokens, f.observed_at, f.valid_from, f.valid_to, "
    "least(coalesce(f.recorded_at, f.created_at), %s), %s, f.created_at, f.updated_at, f.id, "
    "'update', "
    "'bench edit', '{\"kind\": \"bench\"}', false FROM memories_fact f WHERE f.owner_id = %s"
)
EDIT_ALL = (
    "UPDATE memories_fact SET content = regexp_replace(content, '^(\\S+) (.*)$', '\\2 \\1'), "
    "normalized = regexp_replace(normalized, '^(\\S+) (.*)$', '\\2 \\1'), "
    "recorded_at = %s, updated_at = %s WHERE owner_id = %s"
)


def bench_search(owner: Any, rows: list[Scope], calls: int, label: str, at: Any = None) -> None:
    queries = [(unit(1)[0], " ".join(prng.choice(VOCAB) for _ in range(3))) for _ in range(64)]
    counts = []

    def one() -> Any:
        q, words = prng.choice(queries)
        row = prng.choice(rows)
        result = fact_search(
            owner=owner, scope=row, query=words, limit=10, query_vector=q,
            embedder=FixedEmbedder(), at=at,
        )  # fmt: skip
        counts.append(len(result.hits))
        return result

    p50, p99, _ = timed(one, calls)
    report(
        f"search hybrid, {label}",
        p50,
        p99,
        f"rows min {min(counts)} median {statistics.median(counts)}",
    )


def bench_old(owner: Any, rows: list[Scope], calls: int, label: str) -> None:
    p50, p99, last = timed(lambda: old_search(owner.pk, prng.choice(rows).pk, unit(1)[0]), calls, 2)
    report(f"before (owner-wide exact scan), {label}", p50, p99, f"rows {len(last)}")


def bench_injection(owner: Any, row: Scope, calls: int) -> None:
    p50, p99, last = timed(
        lambda: format_for_injection(owner=owner, scope=row, max_tokens=600), calls
    )
    report(
        "injection, 500 facts, 600 tokens",
        p50,
        p99,
        f"{len(last.facts)} facts, {last.tokens} tokens",
    )
    q = unit(1)[0]
    p50, p99, last = timed(
        lambda: format_for_injection(
            owner=owner, scope=row, max_tokens=600, query="w1 w2 w3", query_vector=q,
            embedder=FixedEmbedder(),
        ),
        calls,
    )  # fmt: skip
    report("injection with a query, 500 facts, 600 tokens", p50, p99, f"{len(last.facts)} facts")


def bench_add(owner: Any, row: Scope, calls: int, label: str) -> None:
    added: list[str] = []
    embedder = FixedEmbedder()

    def one() -> Any:
        [d] = fact_add(
            owner=owner, scope=row, facts=[FactIn(text(), confidence=0.9)], max_facts=10**7,
            embedder=embedder,
        )  # fmt: skip
        if d.action == "add":  # (a duplicate names an existing fact: not ours to delete)
            added.append(d.fact_id or "")
        return d

    p50, p99, _ = timed(one, calls, warmup=5)
    report(f"add one fact, {label}", p50, p99)
    for fact_id in added:
        if fact_id:
            fact_delete(owner=owner, fact_id=fact_id, reason="bench cleanup")


def bench_nearest(row: Scope, calls: int, label: str) -> None:
    """The duplicate check alone (the scope's nearest fact), as ``fact_add`` runs it."""
    from memories.facts.search import fact_nearest

    queries = [unit(1)[0] for _ in range(64)]
    p50, p99, _ = timed(lambda: fact_nearest(row, prng.choice(queries).tolist(), MODEL), calls)
    report(f"duplicate check (nearest fact), {label}", p50, p99)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--scopes", type=int, default=10_000)
    parser.add_argument("--per-scope", type=int, default=100)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--large", action="store_true", help="the 1M phase only")
    parser.add_argument("--maintenance-work-mem", default="3GB")
    parser.add_argument(
        "--search-only", action="store_true", help="searches only (no injection, adds, before)"
    )
    parser.add_argument(
        "--pool", type=int, default=0, help="also time the 10k scope with this vector pool"
    )
    parser.add_argument("--history", type=int, default=0, help="edit every fact N times first")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    user_model = get_user_model()
    if args.fresh:
        user_model.objects.filter(username="bench-engine").delete()
    owner, created = user_model.objects.get_or_create(username="bench-engine")
    big = scope_ensure(owner=owner, scope=("bench", "big"))
    inj = scope_ensure(owner=owner, scope=("bench", "inj"))
    if created or not big.links.exists():
        print("loading the 10k scope and the 500-fact scope", flush=True)
        load(owner.pk, [(big.pk, 10_000), (inj.pk, 500)])
        fix_times()
    as_of = edit_history(owner.pk, args.history) if args.history else None
    if not args.large:
        phase_a(args, owner, big, inj)
    if as_of is not None:
        bench_search(owner, [big], args.queries, "10k facts in one scope, as_of", as_of)
        bench_search(owner, [inj], args.queries, "500 facts in one scope, as_of", as_of)
    if args.skip_large:
        return
    phase_b(args, owner, big)


def phase_a(args: argparse.Namespace, owner: Any, big: Scope, inj: Scope) -> None:
    print(f"\nphase A: owner holds {owner_facts(owner.pk):,} facts", flush=True)
    explain("10k facts in one scope", big, unit(1)[0])
    bench_search(owner, [big], args.queries, "10k facts in one scope")
    bench_search(owner, [inj], args.queries, "500 facts in one scope")
    if args.search_only:
        return
    bench_old(owner, [big], 20, "10k facts in one scope")
    bench_injection(owner, inj, args.queries)
    bench_nearest(inj, args.queries, "scope of 500 facts")
    bench_nearest(big, args.queries, "scope of 10,000 facts")
    bench_add(owner, inj, 50, "scope of 500 facts")
    bench_add(owner, big, 50, "scope of 10,000 facts")


def phase_b(args: argparse.Namespace, owner: Any, big: Scope) -> None:
    smalls = list(Scope.objects.filter(owner=owner, path__0="s").order_by("id"))
    if len(smalls) < args.scopes:
        print(f"creating {args.scopes:,} scopes", flush=True)
        have = {tuple(r.scope) for r in smalls}
        Scope.objects.bulk_create(
            [Scope(owner=owner, path=["s", str(i)]) for i in range(args.scopes)
             if ("s", str(i)) not in have]
        )  # fmt: skip
        smalls = list(Scope.objects.filter(owner=owner, path__0="s").order_by("id"))
    empty = [r for r in smalls if not r.links.exists()]
    if empty:
        print(
            f"loading {len(empty) * args.per_scope:,} facts into {len(empty):,} scopes", flush=True
        )
        build = without_hnsw(args.maintenance_work_mem)
        for i in range(0, len(empty), 1000):
            load(owner.pk, [(r.pk, args.per_scope) for r in empty[i : i + 1000]])
        build()
        fix_times()
    print(f"\nphase B: owner holds {owner_facts(owner.pk):,} facts", flush=True)
    explain("10k-fact scope, owner holds 1M", big, unit(1)[0])
    explain(f"{args.per_scope}-fact scope, owner holds 1M", smalls[0], unit(1)[0])
    bench_search(owner, [big], args.queries, "10k-fact scope, owner holds 1M")
    bench_search(owner, smalls, args.queries, f"{args.per_scope}-fact scopes, owner holds 1M")
    if args.search_only:
        return
    bench_old(owner, [big], 5, "10k-fact scope, owner holds 1M")
    bench_old(owner, smalls, 5, f"{args.per_scope}-fact scopes, owner holds 1M")
    bench_add(owner, smalls[0], 50, f"scope of {args.per_scope} facts, owner holds 1M")
    bench_add(owner, big, 50, "scope of 10,000 facts, owner holds 1M")


def owner_facts(owner_id: int) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM memories_fact WHERE owner_id = %s", [owner_id])
        return int(cur.fetchone()[0])


if __name__ == "__main__":
    main()
