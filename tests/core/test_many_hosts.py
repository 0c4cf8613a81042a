"""Many hosts on one database (issue 28, item 3): two web servers and three worker
clusters, each its own process tree with its own environment and data directory (its
own ``WORKER_STATE_DIR``, as a separate machine has), all on one PostgreSQL.

The database is an embedded server of a data directory no host uses; every host
reaches it through ``DATABASE_URL``. Host ``a`` and host ``b`` each run a web server
(``serve --no-worker``, both started at once: one migrates while the other waits) and
a worker (``manage.py worker``) on the host's data directory; host ``c`` runs a
worker only. Knowledge ingestion jobs go in through both web servers; the embeddings
come from a loopback server that answers after a delay and records which document
each call embedded (the side effect counted).

1. Every job runs exactly once: each document's chunk written once, each job claimed
   once, each document embedded once.
2. SIGKILL of host ``a``'s whole worker (supervisor, cluster, workers) while its
   workers embed: ``/healthz`` on ``a`` says its worker is down (``degraded``) while
   ``b`` says ok, with the two clusters left; the rows ``a`` had claimed come back
   (after ``Q_RETRY``, 36 s here, or once ``a``'s cluster counts as dead, whichever
   comes first) and hosts ``b`` and ``c`` finish them: each document once in the
   database, the jobs cut short claimed twice and embedded twice, the others once.
   ``a``'s worker started again: ``/healthz`` on ``a`` is ok again.
3. Schedules fire once per period across the three clusters: the repo's
   ``engine-updates-sweep`` (a minute period) made due five times over, one task each
   time; and 40 one-off schedules due at one moment, each fired once.

And, with ``Q_RETRY`` at 10 minutes, a whole host killed (its supervisor and its
cluster's process group at once: nobody left on it to hand its claims back): the task
it was running is handed back by the other host's sweep once the dead host's cluster
stopped beating for ``CLUSTER_DEAD_SECONDS`` (``core.worker_claims``), and runs there
once, minutes before ``Q_RETRY``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse
from collections import Counter
from datetime import timedelta

import pytest

from core.worker_claims import CLUSTER_BEAT_SECONDS, CLUSTER_DEAD_SECONDS, CLUSTER_SWEEP_SECONDS
from scripts.faults.harness import Instance, title
from tests.core.test_self_healing import _wait
from tests.fakes.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.slow

DIMENSIONS = 384
# A task's time limit, and the redelivery of a claimed row: the first tasks of a new
# worker process import a lot, which took over 10 s on this machine under load.
Q_TIMEOUT, Q_RETRY = 30, 36
JOBS = 12  # per phase, half through each web server


class SlowEmbedder:
    """Answers embeddings after ``delay`` seconds; records the document of each call
    (every text of a job's document starts with its ``doc-<n>`` tag)."""

    def __init__(self) -> None:
        self.delay = 0.5
        self.lock = threading.Lock()
        self.calls: list[str] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        with self.lock:
            self.calls += [text.split()[0] for text in texts]
        time.sleep(self.delay)
        return [[1.0 / (1 + i + len(text))] * DIMENSIONS for i, text in enumerate(texts)]

    def count(self, prefix: str = "doc-") -> Counter[str]:
        with self.lock:
            return Counter(doc for doc in self.calls if doc.startswith(prefix))


@pytest.fixture
def hosts(openai_server: FakeOpenAIServer):
    from django.conf import settings

    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs an embedded server of its own data directory")
    common = {
        "EMBEDDING_PROVIDER": "openai", "EMBEDDING_BASE_URL": openai_server.base_url,
        "EMBEDDING_API_KEY": "sk-test", "EMBEDDING_MODEL": "fake-embed",
        "EMBEDDING_DIMENSIONS": str(DIMENSIONS), "EMBEDDING_MAX_RETRIES": "0",
        "Q_TIMEOUT": str(Q_TIMEOUT), "Q_RETRY": str(Q_RETRY), "LOG_LEVEL": "INFO",
    }  # fmt: skip
    yield from _hosts(common, "abc")


def _hosts(common: dict[str, str], names: str):
    """An embedded database of its own data directory, and a host per name of
    ``names`` that reaches it through ``DATABASE_URL``."""
    database = Instance(env_overrides=common)
    database.manage("embedded_db", "start")
    pid_lines = (database.data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
    socket_dir = urllib.parse.quote(pid_lines[4], safe="")
    url = f"postgresql://postgres@{socket_dir}:{pid_lines[3]}/memory"
    made = {name: Instance(env_overrides={**common, "DATABASE_URL": url}) for name in names}
    try:
        yield database, made
    finally:
        for host in made.values():
            host.destroy()
        database.destroy()


def _ingest(host: Instance, tag: str) -> str:
    base = host.post("/api/v1/knowledge-bases", {"name": tag})
    assert base.status == 201, base.body
    reply = host.post(f"/api/v1/knowledge-bases/{base.body['id']}/documents", {
        "documents": [{"text": f"{tag} is a document of the many-hosts test", "source_key": tag}],
        "background": True,
    })  # fmt: skip
    assert reply.status == 202, reply.body
    return tag


def _jobs(database: Instance, prefix: str) -> dict[str, tuple[str, int, int]]:
    """Per document tag: (job status, attempts, chunks in its base)."""
    rows = database.query(
        "SELECT b.name, j.status, j.attempts, "
        "(SELECT count(*) FROM knowledge_chunk c WHERE c.knowledge_base_id = b.id) "
        "FROM knowledge_ingestjob j JOIN knowledge_knowledgebase b ON b.id = j.knowledge_base_id "
        "WHERE b.name LIKE %s",
        [prefix + "%"],
    )
    return {name: (status, attempts, chunks) for name, status, attempts, chunks in rows}


def _all_done(database: Instance, prefix: str) -> bool:
    jobs = _jobs(database, prefix)
    return len(jobs) == JOBS and all(s == "succeeded" for s, _, _ in jobs.values())


def _health(host: Instance) -> dict:
    reply = host.get("/healthz")  # with the key: the full report
    assert reply.status == 200, reply.body
    return reply.body


def _processing(host: Instance, supervisor: int) -> int:
    return sum(1 for p in host.workers(supervisor) if " processing" in title(p))


def _stop(workers: dict) -> None:
    """Stop every worker host still running (its whole process group), then reap them."""
    for proc in workers.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in workers.values():
        proc.wait(60)


def _schedule(database: Instance, name: str, kind: str, next_run: str) -> None:
    """A schedule of the repo's engine-updates sweep (``kind``: its type and minutes)."""
    database.query(
        "INSERT INTO django_q_schedule (name, func, schedule_type, minutes, repeats, next_run) "
        f"VALUES (%s, 'ingestion.tasks.engine_updates_sweep', {kind}, -1, {next_run}) "
        "RETURNING id",
        [name],
    )


def _fired(database: Instance, group: str) -> int:
    return database.query('SELECT count(*) FROM django_q_task WHERE "group" = %s', [group])[0][0]


def test_two_web_hosts_and_three_worker_clusters_on_one_database(hosts, openai_server):
    database, host = hosts
    embedder = SlowEmbedder()
    openai_server.embed_fn = embedder
    web = [host["a"], host["b"]]
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for server in web:  # at once: one migrates, the other waits for it
            server.start("serve", "--no-worker")
        web[0].wait_healthy(worker=False)  # the database is migrated
        for name in "abc":
            workers[name] = host[name].spawn("worker")
        web[1].key = web[0].ensure_key()  # one database: one key for both
        web[1].wait_healthy(worker=False)
        assert _wait(lambda: len(_health(web[0])["worker"]["clusters"]) == 3, 90)
        for name in "abc":
            assert _wait(lambda n=name: len(host[n].workers(workers[n].pid)) == 2, 60)

        # --- healthz: three clusters, each web host's own worker ok -------------------
        for server in web:
            assert _wait(lambda s=server: _health(s)["worker"]["host"]["status"] == "ok", 30)
            body = _health(server)
            assert body["status"] == "ok" and body["worker"]["status"] == "ok"
            assert len(body["worker"]["host"]["supervisors"]) == 1
            assert body["worker"]["host"]["supervisors"][0]["alive"] is True
            assert server.get("/healthz", auth=False).body["worker"] == {
                "status": "ok", "host": {"status": "ok"}
            }  # fmt: skip
        # the supervisor a web host sees as its own is its host's, not another's
        own = {n: _health(host[n])["worker"]["host"]["supervisors"][0]["pid"] for n in "ab"}
        assert own == {"a": workers["a"].pid, "b": workers["b"].pid}

        # --- 1. every job once ----------------------------------------------------------
        for n in range(JOBS):
            _ingest(web[n % 2], f"doc-1-{n}")
        assert _wait(lambda: _all_done(database, "doc-1-"), 60), database.query(
            "SELECT status, attempts, error FROM knowledge_ingestjob"
        )
        assert _jobs(database, "doc-1-") == {
            f"doc-1-{n}": ("succeeded", 1, 1) for n in range(JOBS)
        }  # fmt: skip
        assert embedder.count("doc-1-") == Counter({f"doc-1-{n}": 1 for n in range(JOBS)})

        # --- 2. SIGKILL of host a's whole worker mid-work ----------------------------
        embedder.delay = 3.0
        for n in range(JOBS):
            _ingest(web[n % 2], f"doc-2-{n}")
        # b and c hold at most 10 of the 12 (each cluster: 2 running, 2 queued, 1 in its
        # pusher: queue_limit), so a gets work however its pusher's polls fall
        assert _wait(lambda: _processing(host["a"], workers["a"].pid) >= 1, 30)
        time.sleep(1.0)  # its runs have claimed their jobs and wait for their embeddings
        os.killpg(workers["a"].pid, signal.SIGKILL)  # supervisor, cluster, workers
        workers["a"].wait(30)
        killed_at = time.monotonic()
        embedder.delay = 0.5

        def a_down():
            body = _health(web[0])
            return body if body["worker"]["host"]["status"] == "down" else None

        body = _wait(a_down, 15)
        assert body, _health(web[0])
        assert body["status"] == "degraded"
        assert body["worker"]["host"]["supervisors"] == [
            {"pid": workers["a"].pid, "alive": False,
             "cluster_pid": body["worker"]["host"]["supervisors"][0]["cluster_pid"],
             "cluster": "down"}
        ]  # fmt: skip
        assert web[0].get("/healthz", auth=False).body["worker"] == {
            "status": "ok", "host": {"status": "down"}
        }  # the cluster-wide work goes on; this host's worker is dead  # fmt: skip
        # the dead cluster's heartbeat expires within seconds: two clusters left
        assert _wait(lambda: len(_health(web[0])["worker"]["clusters"]) == 2, 15)
        body_b = _health(web[1])
        assert body_b["status"] == "ok" and body_b["worker"]["host"]["status"] == "ok"
        assert len(body_b["worker"]["clusters"]) == 2

        # b and c take over what a had claimed once Q_RETRY passed since its claims
        assert _wait(lambda: _all_done(database, "doc-2-"), Q_RETRY + 60), (
            _jobs(database, "doc-2-"),
            host["a"].log()[-2000:],
        )
        assert time.monotonic() - killed_at < Q_RETRY + 60
        jobs = _jobs(database, "doc-2-")
        cut = {tag for tag, (_, attempts, _) in jobs.items() if attempts == 2}
        assert 1 <= len(cut) <= 2, jobs  # what a's two workers were embedding
        assert jobs == {
            tag: ("succeeded", 2 if tag in cut else 1, 1) for tag in jobs
        }  # each document's chunk once  # fmt: skip
        assert embedder.count("doc-2-") == Counter(
            {tag: 2 if tag in cut else 1 for tag in jobs}
        )  # the runs cut short, and one run for every other job

        # host a's worker again: its host is ok again, the dead one's file swept
        workers["a"] = host["a"].spawn("worker")
        assert _wait(lambda: _health(web[0])["worker"]["host"]["status"] == "ok", 90), _health(
            web[0]
        )["worker"]
        supervisors = _health(web[0])["worker"]["host"]["supervisors"]
        assert [s["pid"] for s in supervisors] == [workers["a"].pid]
        assert _wait(lambda: len(_health(web[0])["worker"]["clusters"]) == 3, 30)

        # --- 3. schedules: once per period across the three clusters ------------------
        # A minute schedule of the repo's sweep, its period ended five times over (moved
        # due); and 40 one-off schedules due at one moment.
        sweep = "many-hosts-sweep"
        _schedule(database, sweep, "'I', 1", "now() + interval '1 hour'")
        for period in range(1, 6):
            database.query(
                "UPDATE django_q_schedule SET next_run = now() - interval '1 second' "
                "WHERE name = %s RETURNING id",
                [sweep],
            )
            assert _wait(lambda p=period: _fired(database, sweep) >= p, 20), period
            ahead = database.query(
                "SELECT next_run - now() FROM django_q_schedule WHERE name = %s", [sweep]
            )[0][0]
            assert timedelta(seconds=50) < ahead <= timedelta(minutes=1)
        for n in range(1, 41):
            _schedule(database, f"once-{n}", "'O', NULL", "now() + interval '2 seconds'")
        assert _wait(lambda: sum(_fired(database, f"once-{n}") for n in range(1, 41)) >= 40, 30)
        time.sleep(2)  # a second fire of any of them would be here by now
        assert _fired(database, sweep) == 5
        assert {n: _fired(database, f"once-{n}") for n in range(1, 41)} == dict.fromkeys(
            range(1, 41), 1
        )
        left = database.query("SELECT name FROM django_q_schedule WHERE name LIKE 'once-%'")
        assert left == []  # a one-off schedule is deleted when it fires
    finally:
        _stop(workers)
        for server in web:
            server.stop()


# --- a whole host dies ----------------------------------------------------------------
DEAD_HOST_RETRY = 600  # Q_RETRY: the claim would otherwise come back after 10 minutes
# A task that records which host runs it (each host's MEMORY_DATA_DIR), then waits for
# the test to let it finish.
BLOCKING = 'echo "$MEMORY_DATA_DIR" >> {runs}; while [ ! -e {release} ]; do sleep 0.2; done'


@pytest.fixture
def two_hosts():
    from django.conf import settings

    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs an embedded server of its own data directory")
    common = {"Q_TIMEOUT": "120", "Q_RETRY": str(DEAD_HOST_RETRY), "LOG_LEVEL": "INFO"}
    yield from _hosts(common, "ab")


def _lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_dead_hosts_claimed_task_runs_on_another_host_long_before_q_retry(two_hosts, tmp_path):
    database, host = two_hosts
    a, b = host["a"], host["b"]
    runs, release = tmp_path / "runs", tmp_path / "release"
    a.manage("migrate")
    a.manage("createcachetable")
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        # Host a alone: it claims the task and runs it.
        workers["a"] = a.spawn("worker")
        script = BLOCKING.format(runs=runs, release=release)
        a.manage(
            "shell", "-c",
            "from django_q.tasks import async_task\n"
            f"async_task('subprocess.check_call', ['sh', '-c', {script!r}], task_name='dead-host')",
        )  # fmt: skip
        assert _wait(lambda: _lines(runs) == [str(a.data_dir)], 90), a.log()[-2000:]
        # a's start queued the due schedules too: its other worker runs them (two rows in
        # one CI run); then the blocked task is the queue's one row.
        assert _wait(lambda: len(database.query("SELECT id FROM django_q_ormq")) == 1, 60), (
            database.query("SELECT id, lock FROM django_q_ormq"),
            a.log()[-2000:],
        )
        ((task_id, lock),) = database.query("SELECT id, lock FROM django_q_ormq")
        claims = database.query("SELECT cluster_id, task_id, lock FROM core_workerclaim")
        (cluster_a,) = database.query("SELECT name FROM core_workercluster")[0]
        assert claims == [(cluster_a, task_id, lock)]
        assert (lock - database.query("SELECT now()")[0][0]).total_seconds() > 500

        # Host b's worker up and beating; then host a dies whole: its supervisor (nothing
        # left on a to hand its claims back), then its cluster's process group.
        workers["b"] = b.spawn("worker")
        assert _wait(lambda: len(b.workers(workers["b"].pid)) == 2, 90), b.log()[-2000:]
        assert _wait(lambda: len(database.query("SELECT name FROM core_workercluster")) == 2, 30)
        cluster_pid = a.cluster_main(workers["a"].pid).pid
        os.killpg(workers["a"].pid, signal.SIGKILL)
        os.killpg(cluster_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        workers["a"].wait(30)

        # b's sweep hands the task back once a's cluster has not beaten for the limit.
        limit = CLUSTER_DEAD_SECONDS + CLUSTER_SWEEP_SECONDS + 20  # + a loaded machine's slack
        assert _wait(lambda: len(_lines(runs)) == 2, limit), (b.log()[-3000:], _lines(runs))
        handed_over = time.monotonic() - killed_at
        assert CLUSTER_DEAD_SECONDS - CLUSTER_BEAT_SECONDS - 2 < handed_over < limit
        assert handed_over < DEAD_HOST_RETRY / 5
        assert _lines(runs) == [str(a.data_dir), str(b.data_dir)]
        # a's cluster, named; its claims were the task and any other row it had claimed
        # by then (b's start queues the due schedules, which a's idle worker may take).
        handed = re.search(
            rf"cluster {re.escape(cluster_a)} stopped beating; handed back (\d+) task", b.log()
        )
        assert handed is not None and int(handed.group(1)) >= 1, b.log()[-3000:]
        (cluster_b,) = database.query("SELECT name FROM core_workercluster")[0]
        assert cluster_b != cluster_a  # a's record went with its claims
        ((claimer, claimed, lock_b),) = database.query(
            "SELECT cluster_id, task_id, lock FROM core_workerclaim"
        )
        assert (claimer, claimed) == (cluster_b, task_id) and lock_b > lock

        # It finishes once, on b: its row and its claim gone.
        release.touch()
        done = "SELECT success FROM django_q_task WHERE name = 'dead-host'"
        assert _wait(lambda: database.query(done), 60), b.log()[-2000:]
        time.sleep(2)  # a second run would have started by now
        assert database.query(done) == [(True,)]
        assert _lines(runs) == [str(a.data_dir), str(b.data_dir)]
        assert database.query("SELECT id FROM django_q_ormq") == []
        assert database.query("SELECT task_id FROM core_workerclaim") == []
    finally:
        _stop(workers)
