"""The fault sections: each drives a served ``Instance`` and returns its figures.

A section is a function ``(instance, **params) -> dict`` registered in ``SECTIONS``
with its default parameters; ``scripts/fault_suite.py`` runs them in order on one
instance and prints the figures, the slow tests run them with smaller parameters and
assert on the figures. The attacker's sections (hostile input, schemathesis, the
cross-tenant sweep) live in ``scripts/faults/attacks.py``.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import psutil
import psycopg

from scripts.faults.attacks import hostile_input, schemathesis_run
from scripts.faults.harness import Instance, Reply, alive, title
from scripts.faults.tenancy import cross_tenant


# --- worker kills during Memory Base ingestion ------------------------------------------
def _memory_base(inst: Instance, threshold: int) -> tuple[str, str, str]:
    flow = inst.post("/api/v1/flows", {"name": f"faults-{uuid.uuid4().hex[:8]}"}).body["id"]
    mb = inst.post(
        "/api/v1/memories",
        {"name": f"faults-{uuid.uuid4().hex[:8]}", "flow": flow, "threshold": threshold},
    ).body
    return flow, mb["id"], mb["knowledge_base"]


def _killer(inst: Instance, kills: int, every: float, killed: list[int], stop: threading.Event):
    def run() -> None:
        rng = random.Random(14)
        while not stop.is_set() and len(killed) < kills:
            workers = inst.workers()
            busy = [w for w in workers if "processing" in title(w)]
            pool = busy or workers
            if pool:
                victim = rng.choice(pool)
                try:
                    os.kill(victim.pid, signal.SIGKILL)
                    killed.append(victim.pid)
                except ProcessLookupError:
                    pass
            stop.wait(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _ingestion_state(inst: Instance, flow: str, mb: str, kb: str) -> dict[str, Any]:
    outputs = {
        row[0]
        for row in inst.query(
            "SELECT id FROM ingestion_message WHERE flow_id = %s AND is_output", [flow]
        )
    }
    chunks = Counter(
        int(row[0])
        for row in inst.query(
            "SELECT message_id FROM knowledge_chunk WHERE knowledge_base_id = %s "
            "AND message_id <> ''",
            [kb],
        )
    )
    processed = inst.query(
        "SELECT coalesce(sum(total_processed), 0) FROM ingestion_memorybasesession "
        "WHERE memory_base_id = %s",
        [mb],
    )[0][0]
    # A cursor ahead: a session's cursor at or past an output that has no chunk.
    ahead = inst.query(
        "SELECT count(*) FROM ingestion_memorybasesession s JOIN ingestion_message m "
        "ON m.flow_id = %s AND m.session_id = s.session_id AND m.is_output "
        "AND (m.created_at, m.id) <= (s.cursor_created_at, s.cursor_message_id) "
        "WHERE s.memory_base_id = %s AND NOT EXISTS (SELECT 1 FROM knowledge_chunk c "
        "WHERE c.knowledge_base_id = %s AND c.message_id = m.id::text)",
        [flow, mb, kb],
    )[0][0]
    active = inst.query(
        "SELECT count(*) FROM ingestion_ingestionjob WHERE memory_base_id = %s "
        "AND status IN ('queued', 'running')",
        [mb],
    )[0][0]
    return {
        "outputs": len(outputs),
        "ingested": len(outputs & set(chunks)),
        "lost": len(outputs - set(chunks)),
        "duplicated": sum(1 for n in chunks.values() if n > 1) + max(0, processed - len(outputs)),
        "cursors_ahead": ahead,
        "active_jobs": active,
    }


def worker_kills(
    inst: Instance,
    *,
    outputs: int = 1500,
    sessions: int = 10,
    threshold: int = 10,
    kills: int = 20,
    kill_every: float = 1.0,
    bound: float = 180.0,
) -> dict[str, Any]:
    """Capture ``outputs`` through /runs while a worker is SIGKILLed every ``kill_every``
    seconds (``kills`` in all), then flush; every output must be ingested exactly once
    within ``bound`` seconds after the last kill."""
    inst.wait_healthy()
    flow, mb, kb = _memory_base(inst, threshold)
    killed: list[int] = []
    stop = threading.Event()
    killer = _killer(inst, kills, kill_every, killed, stop)
    refused = Counter()
    started = time.monotonic()
    for i in range(outputs):
        reply = inst.post(
            f"/api/v1/flows/{flow}/runs",
            {
                "session_id": f"s{i % sessions}",
                "run_id": f"r{i}",
                "messages": [
                    {"role": "user", "content": f"question {i}"},
                    {"role": "assistant", "content": f"answer number {i} about topic {i % 7}"},
                ],
            },
        )
        if reply.status != 201:
            refused[reply.status] += 1
    killer.join(timeout=kills * kill_every + 30)
    stop.set()
    last_kill = time.monotonic()
    deadline = last_kill + bound
    flushes = Counter()
    state = _ingestion_state(inst, flow, mb, kb)
    while time.monotonic() < deadline:
        if state["lost"] == 0 and state["active_jobs"] == 0:
            break
        if state["active_jobs"] == 0:
            flushes[inst.post(f"/api/v1/memories/{mb}/flush", {}).status] += 1
        time.sleep(1.0)
        state = _ingestion_state(inst, flow, mb, kb)
    health = inst.get("/healthz", auth=False).body
    return {
        **state,
        "stuck": state["lost"] + state["active_jobs"],
        "worker_kills": len(killed),
        "capture_refused": dict(refused),
        "seconds_capturing": round(last_kill - started, 1),
        "seconds_to_drain_after_last_kill": round(time.monotonic() - last_kill, 1),
        "cluster_restarts_by_watchdog": inst.log().count("is stuck:"),
        "tasks_handed_back_from_killed_workers": inst.log().count("of killed worker"),
        "healthz_worker_after": health["worker"]["status"],
    }


# --- kill -9 of the worker's main process ------------------------------------------------
def worker_main_kill(inst: Instance, *, bound: float = 30.0) -> dict[str, Any]:
    """SIGKILL the cluster's main process under ``serve``: the web keeps answering, a
    new cluster runs a task within ``bound`` seconds, no process of the old one is left."""
    inst.wait_healthy()
    main = inst.cluster_main()
    assert main is not None, "no worker cluster under serve"
    old = [main, *main.children(recursive=True)]
    web_failures = 0
    web_requests = 0
    os.kill(main.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    back = None
    flow, mb, kb = _memory_base(inst, threshold=1)
    while time.monotonic() - killed_at < bound:
        web_requests += 1
        reply = inst.get("/api/v1/flows")
        web_failures += reply.status != 200
        new = inst.cluster_main()
        if back is None and new is not None and new.pid != main.pid and inst.workers():
            back = time.monotonic() - killed_at
        if back is not None:
            break
        time.sleep(0.2)
    # The new cluster does work: one output, threshold 1 -> a job that must finish.
    inst.post(
        f"/api/v1/flows/{flow}/runs",
        {"session_id": "after-kill", "messages": [{"role": "assistant", "content": "back"}]},
    )
    task_done = None
    while time.monotonic() - killed_at < bound * 2:
        if _ingestion_state(inst, flow, mb, kb)["ingested"] == 1:
            task_done = time.monotonic() - killed_at
            break
        time.sleep(0.3)
    orphans = alive(old)
    return {
        "web_requests_while_down": web_requests,
        "web_failures": web_failures,
        "seconds_to_new_cluster": round(back, 1) if back is not None else None,
        "seconds_to_first_task_done": round(task_done, 1) if task_done is not None else None,
        "orphans_of_old_cluster": [f"{p.pid} {title(p)[:50]}" for p in orphans],
    }


def serve_sigterm(inst: Instance, *, bound: float = 40.0, expect: int = 8) -> dict[str, Any]:
    """SIGTERM to serve: it exits and no process of its tree is left. The tree is
    counted whole (``Instance.whole_tree``)."""
    inst.wait_healthy()
    tree = inst.whole_tree(expect)
    started = time.monotonic()
    code = inst.stop(timeout=bound)
    seconds = time.monotonic() - started
    time.sleep(0.5)
    left = alive(tree)
    return {
        "processes_before": len(tree),
        "exit_code": code,
        "seconds_to_exit": round(seconds, 1),
        "left_after_exit": [f"{p.pid} {title(p)[:50]}" for p in left],
    }


# --- the database killed under load ------------------------------------------------------
def _classify(reply: Reply) -> str:
    if 200 <= reply.status < 300:
        return "ok"
    if reply.status == 503 and reply.json_shape and reply.headers.get("Retry-After"):
        return "503_database_unavailable" if _code(reply) == "database_unavailable" else "503"
    return str(reply.status)


def _code(reply: Reply) -> str | None:
    error = reply.body.get("error") if isinstance(reply.body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def database_kill(
    inst: Instance,
    *,
    how: str = "kill",
    threads: int = 4,
    before: float = 3.0,
    after: float = 15.0,
) -> dict[str, Any]:
    """Load (writes to /messages and to a knowledge base's /documents, reads of
    /memories and /healthz) on ``threads``
    threads; after ``before`` seconds the postmaster is SIGKILLed (``how="kill"``) or
    stopped (``how="stop"``, as ``make db-stop``); load goes on ``after`` seconds.
    Every 2xx write must be in the table; no request may answer anything but 2xx or
    503 ``database_unavailable`` with ``Retry-After``."""
    inst.wait_healthy()
    flow = inst.post("/api/v1/flows", {"name": f"db-{uuid.uuid4().hex[:8]}"}).body["id"]
    kb = inst.post("/api/v1/knowledge-bases", {"name": f"db-{uuid.uuid4().hex[:8]}"}).body["id"]
    results: list[tuple[float, str, str, str | None]] = []  # (t, kind, class, write id)
    lock = threading.Lock()
    stop = threading.Event()

    def load(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            kind = ("write", "read", "document", "health")[i % 4]
            write_id = None
            try:
                if kind == "document":
                    write_id = f"d{n}-{i}"
                    reply = inst.post(
                        f"/api/v1/knowledge-bases/{kb}/documents",
                        {"documents": [{"text": f"document {write_id}", "source_key": write_id}]},
                        timeout=20,
                    )
                elif kind == "write":
                    write_id = f"w{n}-{i}"
                    reply = inst.post(
                        "/api/v1/messages",
                        {
                            "flow": flow,
                            "session_id": "db-load",
                            "run_id": write_id,
                            "role": "assistant",
                            "content": f"row {write_id}",
                        },
                        timeout=20,
                    )
                elif kind == "read":
                    reply = inst.get("/api/v1/memories", timeout=20)
                else:
                    reply = inst.get("/healthz", auth=False, timeout=20)
                outcome = _classify(reply)
                if reply.status == 202:  # accepted as a background job: the job row is the write
                    write_id = f"job:{reply.body['id']}"
            except OSError as exc:
                outcome = f"connection error ({type(exc).__name__})"
            with lock:
                results.append((time.monotonic(), kind, outcome, write_id))
            time.sleep(0.02)

    workers = [threading.Thread(target=load, args=(n,), daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(before)
    pid = inst.postmaster_pid()
    killed_at = time.monotonic()
    if how == "kill":
        os.kill(pid, signal.SIGKILL)
    else:  # what `make db-stop` does, without waiting: the service starts it again
        import pgserver._commands as commands

        user = "pgserver" if os.geteuid() == 0 else None
        commands.pg_ctl(["-W", "-m", "fast", "stop"], pgdata=inst.data_dir / "pgdata", user=user)
    time.sleep(after)
    stop.set()
    for worker in workers:
        worker.join(timeout=30)
    deadline = time.monotonic() + 60  # the figures need the server back
    while time.monotonic() < deadline:
        try:
            inst.query("SELECT 1")
            break
        except psycopg.OperationalError:
            time.sleep(0.5)
    new_pid = inst.postmaster_pid()
    rows = {
        r[0] for r in inst.query("SELECT run_id FROM ingestion_message WHERE flow_id = %s", [flow])
    } | {
        r[0]
        for r in inst.query(
            "SELECT document_key FROM knowledge_chunk WHERE knowledge_base_id = %s", [kb]
        )
    }
    jobs = dict(
        inst.query(
            "SELECT 'job:' || id, status FROM knowledge_ingestjob WHERE knowledge_base_id = %s",
            [kb],
        )
    )
    rows |= set(jobs)
    during = [r for r in results if r[0] >= killed_at]
    # Down from the kill until the first success after the first failure (a stop
    # takes a moment: requests still succeed while the server shuts down).
    first_fail = next((r[0] for r in during if r[2] != "ok"), None)
    first_ok = next(
        (r[0] for r in during if first_fail and r[0] > first_fail and r[2] == "ok"), None
    )
    outage = [r for r in during if first_fail and (first_ok is None or r[0] < first_ok)]
    ok_writes = {r[3] for r in results if r[3] and r[2] == "ok"}
    failed_writes = {r[3] for r in results if r[3] and r[2] != "ok"}
    return {
        "how": how,
        "requests": len(results),
        "requests_while_down": len(outage),
        "while_down_by_outcome": dict(Counter(r[2] for r in outage)),
        "all_by_outcome": dict(Counter(r[2] for r in results)),
        "other_5xx": sum(
            1 for r in results if r[2].startswith("5") and r[2] != "503_database_unavailable"
        ),
        "seconds_to_recover": round(first_ok - killed_at, 1) if first_ok else None,
        "server_restarted": bool(new_pid and new_pid != pid and psutil.pid_exists(new_pid)),
        "writes_2xx": len(ok_writes),
        "writes_2xx_missing": len(ok_writes - rows),
        "writes_failed_but_committed": len(failed_writes & rows),
        "document_batches_queued_as_jobs": dict(Counter(jobs.values())),
    }


SECTIONS: dict[str, tuple[Callable[..., dict[str, Any]], dict[str, Any]]] = {
    "worker_kills": (worker_kills, {}),
    "worker_main_kill": (worker_main_kill, {}),
    "database_kill": (database_kill, {"how": "kill"}),
    "database_stop": (database_kill, {"how": "stop"}),
    "hostile_input": (hostile_input, {}),
    "schemathesis": (schemathesis_run, {"examples": 10}),
    "cross_tenant": (cross_tenant, {}),
    "serve_sigterm": (serve_sigterm, {}),  # last: it stops the instance
}
