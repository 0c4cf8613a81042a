"""Load: a mixed workload over HTTP against served web processes on one database.

    .venv/bin/python bench/bench_load.py --web-processes 1 --seconds 60 --clients 16
    .venv/bin/python bench/bench_load.py --web-processes 2 --seconds 60 --clients 16

``--web-processes`` ``manage.py serve --no-worker`` processes (gunicorn, ``--web-workers``
workers of 4 threads each, as served in production) on free loopback ports and one
``manage.py worker`` (the django-q2 cluster), standing for web hosts and a worker host over
one database: the embedded PostgreSQL of ``MEMORY_DATA_DIR`` (``--data-dir``, default
``/work/benchdata/load``, database ``bench_load``), the hashing embedder, the chat LLM a
scripted OpenAI-compatible server in this process (``tests/fakes/openai_server.py``
answering as ``scripts/openwebui/demo_llm.py`` does: the engine's extraction learns the
user's first-person sentences). Throttles are off (the clients are one key per owner).

The first run seeds ``--owners`` owners (kept for the next runs): each a knowledge base of
``--chunks`` chunks, ``--users`` end users of 100 facts each, a flow with a memory base
(threshold 10). Then ``--clients`` threads, each with its own keep-alive connection to one
web process (spread evenly over them) and one owner, send for ``--seconds`` a mix of:

- ``knowledge_search``: ``POST /api/v1/knowledge-bases/{id}/search`` (hybrid, top 10);
- ``fact_search``: ``POST /api/v1/users/{u}/memories/search`` (limit 10);
- ``fact_add``: ``POST /api/v1/users/{u}/memories`` (``infer: false``, one new fact);
- ``chat``: ``POST /v1/chat/completions`` as an end user (retrieval, injection, the
  upstream call; formation queued for the worker);
- ``message_capture``: ``POST /api/v1/messages`` into the memory base's flow (its syncs
  queued for the worker).

It prints throughput, p50/p95/p99 and errors per kind, then reads back every acknowledged
write (each fact id answered, each message id answered) through the API and counts any
that is missing. ``--cpu-seconds`` then runs each kind alone for that long and divides the
CPU time of the server's processes (web processes, worker, PostgreSQL: every process of
their trees, exited children included) by the requests served, after the background work
they queued is done and minus the idle rate measured first: the CPU cost per request kind,
from which a larger deployment's capacity is computed (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pwd
import random
import shutil
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.faults.harness import Instance, free_port  # noqa: E402
from scripts.openwebui import demo_llm  # noqa: E402
from tests import pg_cluster  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer, Scripted, chat_body  # noqa: E402
from tests.pg_cluster import Server  # noqa: E402

KINDS = ("knowledge_search", "fact_search", "fact_add", "chat", "message_capture")
# Search is most of the traffic (issue 28); the rest writes (a chat too: its extraction).
MIX = {"knowledge_search": 30, "fact_search": 30, "fact_add": 10, "chat": 15, "message_capture": 15}
TOPICS = ("hiking TypeScript green-tea violin Berlin cycling jazz sushi Rust gardening chess "
          "photography Python running coffee Lisbon").split()  # fmt: skip
WORDS = ("rate limit invoice deploy cluster backup token budget search index replica "
         "session memory tenant vector keyword schema migration worker queue trace").split()  # fmt: skip
DATABASE = "bench_load"
READS_FROM: Counter[str] = Counter()
READS_LOCK = threading.Lock()


def replicas_down_for() -> float:
    from core.replicas import DOWN_FOR

    return DOWN_FOR + 1


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# --- the deployment ----------------------------------------------------------------------
class Deployment:
    """``web`` serve processes and one worker over one embedded PostgreSQL; with
    ``replica``, a streaming standby of it (``pg_basebackup -R`` from the embedded server's
    own binaries, ``hot_standby_feedback = on``) that the web processes read from
    (``DATABASE_REPLICA_URLS``, read-your-writes: ``core.replicas``). Its URL is known
    before it exists: until it runs, the web processes find it down and read from the
    primary (the seeding, the first seconds)."""

    def __init__(
        self, data_dir: Path, web: int, web_workers: int, llm: dict[str, str], replica: bool
    ) -> None:
        self.standby: Server | None = None
        replica_env = {}
        if replica:
            from urllib.parse import quote

            sockets = data_dir / "replica-socket"
            self.standby = Server(data_dir / "replica", sockets, free_port())
            replica_env["DATABASE_REPLICA_URLS"] = (
                f"postgresql://postgres@{quote(str(sockets), safe='')}:{self.standby.port}/{DATABASE}"
            )
        self.env = {
            "EMBEDDED_DB_NAME": DATABASE,
            "API_THROTTLE_RATE": "",
            "CHAT_THROTTLE_RATE": "",
            "MEMORY_UPDATE_DEBOUNCE_SECONDS": "2",
            **llm,
        }
        self.web_env = {**self.env, **replica_env}
        self.web = [Instance(env_overrides=self.web_env, data_dir=data_dir) for _ in range(web)]
        self.web_workers = web_workers
        self.worker = Instance(env_overrides=self.env, data_dir=data_dir)  # its port unused

    @property
    def first(self) -> Instance:
        return self.web[0]

    def start(self) -> None:
        # One after the other: each serve migrates and collects static files first.
        for inst in self.web:
            inst.start("serve", "--no-worker", "--web-workers", str(self.web_workers))
            inst.wait_healthy(worker=False)
        self.worker.start("worker")
        self.first.wait_healthy(worker=True)

    def start_standby(self) -> None:
        """A fresh standby of the primary, streaming, on its own port and socket."""
        assert self.standby is not None and self.first.data_dir is not None
        lines = (self.first.data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
        for path in (self.standby.data, self.standby.socket_dir):
            shutil.rmtree(path, ignore_errors=True)
        self.standby.socket_dir.mkdir(parents=True)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(pg_cluster.USER)
            os.chown(self.standby.socket_dir, entry.pw_uid, entry.pw_gid)
            os.chown(self.standby.data.parent, entry.pw_uid, entry.pw_gid)
        pg_cluster._run("pg_basebackup", "-D", str(self.standby.data), "-R", "-X", "stream",
                        "-h", lines[4], "-p", lines[3], "-U", "postgres", timeout=600)  # fmt: skip
        with open(self.standby.data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {self.standby.port}\nunix_socket_directories = "
                       f"'{self.standby.socket_dir}'\nhot_standby_feedback = on\n")  # fmt: skip
        self.standby.start()

    def stop(self) -> None:
        for inst in [self.worker, *self.web]:
            inst.stop()
        if self.standby is not None:
            self.standby.stop()

    def conninfo(self) -> str:
        assert self.first.data_dir is not None
        lines = (self.first.data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
        return f"host={lines[4]} port={lines[3]} user=postgres dbname={DATABASE}"

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.conninfo(), autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql).fetchall()

    def app_processes(self) -> list[psutil.Process]:
        return _trees([inst.proc.pid for inst in [*self.web, self.worker] if inst.proc])

    def database_processes(self) -> list[psutil.Process]:
        pids = [self.first.postmaster_pid()]
        if self.standby is not None and (self.standby.data / "postmaster.pid").exists():
            pids.append(self.standby.postmaster_pid())
        return _trees([pid for pid in pids if pid])

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the app's processes and of the database's."""
        return _cpu(self.app_processes()), _cpu(self.database_processes())

    def backlog(self) -> tuple[int, int]:
        """Tasks queued and debounced updates not yet run: 0, 0 once what was asked is done."""
        queued = self.query("SELECT count(*) FROM django_q_ormq")[0][0]
        pending = self.query(
            "SELECT count(*) FROM memory_engine_pendingupdate WHERE status = 'pending'"
        )[0][0]
        return queued, pending


def _trees(roots: list[int]) -> list[psutil.Process]:
    out = []
    for pid in roots:
        try:
            root = psutil.Process(pid)
            out += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    return out


def _cpu(processes: list[psutil.Process]) -> float:
    """User and system time of each process, and of its exited children it has waited for
    (a PostgreSQL backend that ended, a gunicorn worker replaced): each counted once."""
    total = 0.0
    for proc in processes:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


# --- the tenants -------------------------------------------------------------------------
@dataclass
class Owner:
    key: str
    knowledge_base: str
    flow: str
    users: list[str]


class Client:
    """One keep-alive connection to one web process."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, body: Any = None, headers: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        sent = {"Authorization": f"Bearer {self.key}", **(headers or {})}
        if data is not None:
            sent["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, data, sent)
            response = self.conn.getresponse()
            raw = response.read()
            served = response.getheader("X-Read-From")
            if served:  # with --replica: which server answered a read (core.replicas)
                with READS_LOCK:
                    READS_FROM[served] += 1
        except (OSError, http.client.HTTPException):
            self.conn.close()  # the next request opens a new connection
            raise
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw[:200]
        return response.status, parsed


def seed(deployment: Deployment, owners: int, chunks: int, users: int) -> list[Owner]:
    """The owners of earlier runs (``seed.json`` in the data directory), else new ones."""
    inst = deployment.first
    assert inst.data_dir is not None
    saved = inst.data_dir / "seed.json"
    shape = {"owners": owners, "chunks": chunks, "users": users}
    if saved.exists():
        stored = json.loads(saved.read_text())
        if stored["shape"] == shape:
            return [Owner(**o) for o in stored["owners"]]
    made = [_seed_owner(inst, f"load-{uuid.uuid4().hex[:8]}", chunks, users) for _ in range(owners)]
    saved.write_text(json.dumps({"shape": shape, "owners": [o.__dict__ for o in made]}))
    return made


def _seed_owner(inst: Instance, username: str, chunks: int, users: int) -> Owner:
    print(f"seeding {username}: {chunks} chunks, {users} users of 100 facts", flush=True)
    client = Client(inst.port, inst.key_for(username))
    rng = random.Random(username)

    def ok(status: int, body: Any) -> Any:
        assert status in (200, 201), body
        return body

    kb = ok(*client.call("POST", "/api/v1/knowledge-bases", {"name": "load"}))["id"]
    vocabulary = [a + b + c for a in "bcdfgklmnprstvz" for b in "aeiou" for c in "lmnrst"]
    for start in range(0, chunks, 250):
        documents = [
            {"text": " ".join([WORDS[i % len(WORDS)], *rng.choices(vocabulary, k=30)]) + ".",
             "source_key": f"doc-{i}"}
            for i in range(start, min(chunks, start + 250))
        ]  # fmt: skip
        ok(
            *client.call(
                "POST", f"/api/v1/knowledge-bases/{kb}/documents", {"documents": documents}
            )
        )
    for n in range(users):
        facts = [{"role": "user", "content": f"User likes {TOPICS[(n + i) % len(TOPICS)]} "
                  f"and {rng.choice(WORDS)} ({i})"} for i in range(100)]  # fmt: skip
        ok(
            *client.call(
                "POST", f"/api/v1/users/u{n}/memories", {"messages": facts, "infer": False}
            )
        )
    flow = ok(*client.call("POST", "/api/v1/flows", {"name": "load"}))["id"]
    ok(
        *client.call(
            "POST", "/api/v1/memory-bases", {"name": "load", "flow": flow, "threshold": 10}
        )
    )
    return Owner(client.key, kb, flow, [f"u{n}" for n in range(users)])


# --- the workload ------------------------------------------------------------------------
@dataclass
class Results:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    facts: list[tuple[str, str, str]] = field(default_factory=list)  # key, user, fact id
    messages: list[tuple[str, str, str, int]] = field(
        default_factory=list
    )  # key, flow, session, id
    lock: threading.Lock = field(default_factory=threading.Lock)


class Worker(threading.Thread):
    """One client: its connection, owner and kinds, until the deadline."""

    def __init__(self, n: int, run: str, port: int, owner: Owner, kinds: dict[str, int],
                 deadline: float, results: Results) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.n, self.run_id, self.owner, self.deadline, self.results = (
            n,
            run,
            owner,
            deadline,
            results,
        )
        self.client = Client(port, owner.key)
        self.kinds, self.weights = list(kinds), list(kinds.values())
        self.rng = random.Random(f"{run}-{n}")
        self.sent = 0

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            kind = self.rng.choices(self.kinds, self.weights)[0]
            started = time.perf_counter()
            try:
                error = getattr(self, kind)()
            except (OSError, http.client.HTTPException) as exc:
                error = f"{type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - started
            with self.results.lock:
                if error:
                    self.results.errors[kind].append(error[:300])
                else:
                    self.results.latencies[kind].append(elapsed * 1000)
            self.sent += 1

    def _user(self) -> str:
        return self.rng.choice(self.owner.users)

    def knowledge_search(self) -> str | None:
        query = " ".join(self.rng.sample(WORDS, 2))
        status, body = self.client.call("POST", f"/api/v1/knowledge-bases/{self.owner.knowledge_base}/search",
                                        {"query": query, "top_k": 10})  # fmt: skip
        return None if status == 200 and body["results"] else f"{status} {body}"

    def fact_search(self) -> str | None:
        query = f"{self.rng.choice(TOPICS)} {self.rng.choice(WORDS)}"
        status, body = self.client.call("POST", f"/api/v1/users/{self._user()}/memories/search",
                                        {"query": query, "limit": 10})  # fmt: skip
        return None if status == 200 and body["results"] else f"{status} {body}"

    def fact_add(self) -> str | None:
        # Users of this client and run only: under ENGINE_MAX_FACTS each, never evicted.
        user = f"w-{self.run_id}-{self.n}-{self.sent % 8}"
        content = f"User noted {self.rng.choice(WORDS)} {uuid.uuid4().hex[:12]}"
        status, body = self.client.call("POST", f"/api/v1/users/{user}/memories",
                                        {"content": content, "infer": False})  # fmt: skip
        if status != 201 or len(body["memories"]) != 1 or body["evicted"]:
            return f"{status} {body}"
        with self.results.lock:
            self.results.facts.append((self.owner.key, user, body["memories"][0]["id"]))
        return None

    def chat(self) -> str | None:
        topic = self.rng.choice(TOPICS)
        body = {"model": "fake-model", "messages": [
            {"role": "user", "content": f"I like {topic}. What should I do this weekend?"}]}  # fmt: skip
        status, answer = self.client.call("POST", "/v1/chat/completions", body,
                                          {"X-OpenWebUI-User-Id": self._user()})  # fmt: skip
        ok = status == 200 and answer["choices"][0]["message"]["content"]
        return None if ok else f"{status} {answer}"

    def message_capture(self) -> str | None:
        session = f"s-{self.run_id}-{self.n}-{self.sent % 4}"
        role = self.rng.choice(("user", "assistant"))
        body = {"flow": self.owner.flow, "session_id": session, "role": role,
                "content": f"{role} says {' '.join(self.rng.sample(WORDS, 6))}."}  # fmt: skip
        status, answer = self.client.call("POST", "/api/v1/messages", body)
        if status != 201:
            return f"{status} {answer}"
        with self.results.lock:
            self.results.messages.append((self.owner.key, self.owner.flow, session, answer["id"]))
        return None


def drive(ports: list[int], owners: list[Owner], clients: int, seconds: float,
          kinds: dict[str, int], run: str) -> tuple[Results, float]:  # fmt: skip
    results = Results()
    deadline = time.monotonic() + seconds
    threads = [Worker(n, run, ports[n % len(ports)], owners[n % len(owners)], kinds, deadline,
                      results) for n in range(clients)]  # fmt: skip
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.monotonic() - started


def report(results: Results, elapsed: float) -> None:
    done = sum(len(v) for v in results.latencies.values())
    failed = sum(len(v) for v in results.errors.values())
    print(f"\n{done} requests answered in {elapsed:.1f} s: {done / elapsed:.1f} req/s, "
          f"{failed} errors")  # fmt: skip
    print(f"{'kind':18s} {'req/s':>7s} {'p50 ms':>8s} {'p95 ms':>8s} {'p99 ms':>8s} {'errors':>7s}")
    for kind in KINDS:
        values = results.latencies.get(kind, [])
        if not values and not results.errors.get(kind):
            continue
        cells = (f"{pct(values, 0.5):8.1f} {pct(values, 0.95):8.1f} {pct(values, 0.99):8.1f}"
                 if values else f"{'-':>8s} {'-':>8s} {'-':>8s}")  # fmt: skip
        print(f"{kind:18s} {len(values) / elapsed:7.1f} {cells} {len(results.errors[kind]):7d}")
    for kind, errors in results.errors.items():
        for error in sorted(set(errors))[:3]:
            print(f"  {kind} error: {error}")


# --- after the run: every acknowledged write ---------------------------------------------
def verify(port: int, results: Results) -> int:
    """Read back every fact and message answered 2xx; print and return how many are missing."""
    missing = 0
    by_user: dict[tuple[str, str], set[str]] = defaultdict(set)
    for key, user, fact in results.facts:
        by_user[key, user].add(fact)
    for (key, user), wanted in by_user.items():
        missing += len(wanted - _listed(Client(port, key), f"/api/v1/users/{user}/memories?", "id"))
    by_session: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for key, flow, session, message in results.messages:
        by_session[key, flow, session].add(message)
    for (key, flow, session), wanted in by_session.items():
        path = f"/api/v1/messages?flow={flow}&session_id={session}&"
        missing += len(wanted - _listed(Client(port, key), path, "id"))
    print(f"acknowledged writes read back: {len(results.facts)} facts in {len(by_user)} users, "
          f"{len(results.messages)} messages in {len(by_session)} sessions; missing: {missing}")  # fmt: skip
    return missing


def _listed(client: Client, path: str, name: str) -> set[Any]:
    found: set[Any] = set()
    page = 1
    while True:
        status, body = client.call("GET", f"{path}page_size=500&page={page}")
        assert status == 200, body
        found |= {item[name] for item in body["results"]}
        if not body["next"]:
            return found
        page += 1


# --- CPU per request kind ----------------------------------------------------------------
def wait_drained(deployment: Deployment, timeout: float = 900) -> None:
    """Until the background work queued so far is done (on a loaded machine the worker
    may finish a chat phase's extractions minutes after its last request)."""
    started = time.monotonic()
    said = started
    while (backlog := deployment.backlog()) != (0, 0):
        now = time.monotonic()
        if now - started > timeout:
            raise RuntimeError(f"background work not done after {timeout:g} s: {backlog}")
        if now - said > 30:
            print(f"  waiting for the worker: {backlog[0]} tasks queued, "
                  f"{backlog[1]} updates pending", flush=True)  # fmt: skip
            said = now
        time.sleep(0.5)


def cpu_per_kind(deployment: Deployment, ports: list[int], owners: list[Owner], clients: int,
                 seconds: float, run: str) -> None:  # fmt: skip
    wait_drained(deployment)
    idle_seconds = 10.0
    app0, db0 = deployment.cpu()
    time.sleep(idle_seconds)
    app1, db1 = deployment.cpu()
    idle_app, idle_db = (app1 - app0) / idle_seconds, (db1 - db0) / idle_seconds
    print(f"\nidle: app {idle_app * 1000:.0f} ms/s, database {idle_db * 1000:.0f} ms/s "
          f"(subtracted below)")  # fmt: skip
    print(f"{'kind alone':18s} {'req':>6s} {'req/s':>7s} {'app ms':>8s} {'db ms':>8s} "
          f"{'total ms':>9s}  (CPU per request, background work included)")  # fmt: skip
    for kind in KINDS:
        app0, db0 = deployment.cpu()
        started = time.monotonic()
        results, elapsed = drive(ports, owners, clients, seconds, {kind: 1}, f"{run}-{kind}")
        wait_drained(deployment)
        app1, db1 = deployment.cpu()
        span = time.monotonic() - started
        served = len(results.latencies[kind])
        app = (app1 - app0 - idle_app * span) / max(served, 1) * 1000
        db = (db1 - db0 - idle_db * span) / max(served, 1) * 1000
        errors = len(results.errors[kind])
        print(f"{kind:18s} {served:6d} {served / elapsed:7.1f} {app:8.2f} {db:8.2f} "
              f"{app + db:9.2f}" + (f"  ({errors} errors)" if errors else ""), flush=True)  # fmt: skip


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                 "unknown CPU")  # fmt: skip
    memory = psutil.virtual_memory().total / 2**30
    return f"machine: {psutil.cpu_count()} CPUs ({model}), {memory:.1f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--web-processes", type=int, choices=(1, 2), default=1)
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers per serve")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--cpu-seconds", type=float, default=15, help="0: no CPU phases")
    parser.add_argument("--owners", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=2000, help="per owner's knowledge base")
    parser.add_argument("--users", type=int, default=25, help="end users of 100 facts per owner")
    parser.add_argument("--data-dir", type=Path, default=Path("/work/benchdata/load"))
    parser.add_argument("--replica", action="store_true",
                        help="a streaming standby the web processes read from")  # fmt: skip
    args = parser.parse_args()

    upstream = FakeOpenAIServer()
    upstream.chat_fn = lambda payload: Scripted(body=chat_body(demo_llm.answer(payload)))
    upstream.start()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(args.data_dir, args.web_processes, args.web_workers,
                            upstream.llm_env(), args.replica)  # fmt: skip
    run = uuid.uuid4().hex[:6]
    try:
        deployment.start()
        owners = seed(deployment, args.owners, args.chunks, args.users)
        if deployment.standby is not None:
            deployment.start_standby()
            time.sleep(replicas_down_for())  # the web processes look at it again
        ports = [inst.port for inst in deployment.web]
        print(f"\n{machine()}")
        print(f"{args.web_processes} web process(es) x {args.web_workers} gunicorn workers, "
              f"1 worker; {args.clients} clients over {len(owners)} owners for {args.seconds:g} s; "
              f"load average before {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
        drive(ports, owners, args.clients, 5, MIX, f"{run}-warm")  # connections, caches
        results, elapsed = drive(ports, owners, args.clients, args.seconds, MIX, run)
        load = os.getloadavg()
        report(results, elapsed)
        if READS_FROM:
            print(
                "reads answered by: " + ", ".join(f"{k} {v}" for k, v in sorted(READS_FROM.items()))
            )
        print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
              f"({psutil.cpu_count()} CPUs)")  # fmt: skip
        missing = verify(ports[-1], results)
        if args.cpu_seconds:
            cpu_per_kind(deployment, ports, owners, args.clients, args.cpu_seconds, run)
    finally:
        deployment.stop()
        upstream.stop()
        from core.embedded_pg import stop_embedded_postgres

        stop_embedded_postgres(args.data_dir)
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
