"""Debounced updates under the real worker (``manage.py worker``: the supervised django-q2
cluster), killed with updates pending and running, then restarted.

One instance with its own embedded PostgreSQL (``scripts.faults.harness``): the web
server alone (``serve --no-worker``) takes the flushes over HTTP, and a separate
``manage.py worker`` runs them, its scripted LLM a server on 127.0.0.1 that answers an
extraction after 4 s, so the kills land mid-extraction.

How the runs fire under the cluster: a flush writes (or pushes back) its scope's
one-off schedule; the cluster looks for due schedules every second (``core.qcluster``:
django-q2's own look is every 30 s), so a scope's run starts about a second after its
2 s window closes. A run lost with a killed worker is picked up by the minute sweep
(``engine-updates-sweep``, itself a schedule) or by the broker's redelivery after
``Q_RETRY`` (20 s here; a redelivered run of a done scope finds nothing pending). Every
wait below is bounded by those periods plus the LLM's 4 s and the cluster's start.

Phase 1 SIGKILLs the cluster's worker processes (the sentinel starts new ones) while
extractions are in flight; phase 2 SIGKILLs the whole worker (supervisor, cluster,
workers: the process group) and starts a new one. Then every flush is done exactly once:
each scope's flushes of a phase in one batch, each fact and each journal entry once, and
the LLM called once per batch plus once per extraction a kill cut short.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from memories.engine import files
from scripts.faults.harness import Instance
from tests.core.test_self_healing import _wait
from tests.fakes.openai_server import Scripted, chat_body

pytestmark = pytest.mark.slow

SCOPES = {"u1": ["user", "u1"], "u2": ["user", "u2"], "acme": ["org", "acme"]}
LLM_DELAY = 4.0
# An extraction's prompt names its scope; a dream's names it too (the daily dream
# schedule fires once the worker is up, and a dream of a scope whose run committed
# meanwhile calls the LLM): only extractions are counted below.
PROMPT_SCOPE = re.compile(r"You maintain the long-term memory of one scope \(([^)]*)\)")
DREAM_SCOPE = re.compile(r"You consolidate the long-term memory of one scope \(([^)]*)\)")
SAID = re.compile(r"^\[[^\]]+\] user: (\S+) likes (\S+)$", re.M)


class SlowLLM:
    """Extraction answers after ``LLM_DELAY``: "<tag> likes <thing>" becomes the fact
    "User likes <thing>". Records when each extraction arrived, and for which scope;
    any other call (a dream) apart."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, str]] = []  # extractions: (when, scope)
        self.others: list[tuple[float, str]] = []  # any other call (a dream)

    def __call__(self, payload: dict) -> Scripted:
        prompt = "\n".join(str(m.get("content")) for m in payload.get("messages", []))
        scope, dream = PROMPT_SCOPE.search(prompt), DREAM_SCOPE.search(prompt)
        with self.lock:
            if scope:
                self.arrivals.append((time.time(), scope.group(1)))
            else:
                self.others.append((time.time(), f"dream {dream.group(1)}" if dream else "?"))
        facts = [{"content": f"User likes {thing}", "category": "preference",
                  "confidence": 0.9} for _tag, thing in SAID.findall(prompt)]  # fmt: skip
        answer = {"newFacts": facts, "factsToRemove": []}
        return Scripted(body=chat_body(json.dumps(answer)), delay=LLM_DELAY)

    def scopes(self) -> list[str]:
        with self.lock:
            return [scope for _, scope in self.arrivals]

    def count(self) -> int:
        with self.lock:
            return len(self.arrivals)


@pytest.fixture
def instance(openai_server):
    from django.conf import settings

    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs an embedded server of its own data directory")
    inst = Instance(env_overrides={
        "LLM_BASE_URL": openai_server.base_url, "LLM_MODEL": "fake-model",
        "LLM_API_KEY": "sk-test", "LLM_TIMEOUT": "60", "LLM_MAX_RETRIES": "0",
        "MEMORY_UPDATE_DEBOUNCE_SECONDS": "2", "Q_TIMEOUT": "15", "Q_RETRY": "20",
        "LOG_LEVEL": "INFO",
    })  # fmt: skip
    yield inst
    inst.destroy()


def _flush(inst: Instance, phase: int) -> dict[str, list[str]]:
    """Two flushes per scope within its window; returns what each scope was told."""
    told: dict[str, list[str]] = {}
    for tag, scope in SCOPES.items():
        for n in (1, 2):
            thing = f"{tag}-p{phase}-thing{n}"
            reply = inst.post("/api/v1/engine/flush", {
                "scope": scope, "messages": [{"role": "user", "content": f"{tag} likes {thing}"}],
            })  # fmt: skip
            assert reply.status == 202, reply.body
            told.setdefault(tag, []).append(thing)
    return told


def _pending(inst: Instance) -> int:
    return inst.query("SELECT count(*) FROM memory_engine_pendingupdate WHERE status <> 'done'")[0][
        0
    ]


def _batches(inst: Instance) -> int:
    return inst.query(
        "SELECT count(DISTINCT batch_id) FROM memory_engine_pendingupdate WHERE status = 'done'"
    )[0][0]


def _kill_workers(inst: Instance, supervisor: int) -> list[int]:
    killed = []
    for proc in inst.workers(supervisor):
        try:
            os.kill(proc.pid, signal.SIGKILL)
            killed.append(proc.pid)
        except ProcessLookupError:
            pass
    return killed


def _journal_lines(inst: Instance, owner_id: int, scope: list[str]) -> list[str]:
    folder = Path(inst.data_dir) / "media" / "journal" / files.scope_dir(owner_id, scope)
    lines: list[str] = []
    for day in sorted(folder.glob("*.md")):
        lines += re.findall(r"^- \*\*user\*\*: (.*)$", day.read_text(), re.M)
    return lines


def test_worker_killed_with_updates_pending_and_running_then_restarted(instance, openai_server):
    llm = SlowLLM()
    openai_server.chat_fn = llm
    instance.start("serve", "--no-worker")
    worker = instance.spawn("worker")
    try:
        instance.wait_healthy()
        assert _wait(lambda: len(instance.workers(worker.pid)) == 2, 60), instance.log()[-3000:]

        # --- phase 1: the cluster's worker processes die mid-extraction ---------------
        told = _flush(instance, 1)
        # the one-off schedules fire about a second after the window: wait for two
        # extractions in flight (the two worker processes)
        assert _wait(lambda: llm.count() >= 2, 75), instance.log()[-3000:]
        killed = _kill_workers(instance, worker.pid)
        assert len(killed) == 2
        assert _pending(instance) >= 2  # the flushes of the runs cut short: still pending
        # new worker processes (the sentinel's); the sweep or the redelivery runs them
        # (up to the stall limit, 60 s, more if a kill froze the cluster's own queues:
        # the supervisor then restarts it)
        assert _wait(lambda: _pending(instance) == 0, 240), instance.log()[-4000:]
        time.sleep(LLM_DELAY + 2)  # a second run of a done scope would call the LLM now
        phase_1 = llm.scopes()

        # --- phase 2: the whole worker dies, a new one is started --------------------
        for tag, things in _flush(instance, 2).items():
            told[tag] += things
        assert _wait(lambda: llm.count() > len(phase_1), 75), instance.log()[-3000:]
        os.killpg(worker.pid, signal.SIGKILL)  # supervisor, cluster, workers
        worker.wait(30)
        time.sleep(LLM_DELAY + 2)  # no process left to call the LLM or commit
        cut_2 = llm.scopes()[len(phase_1) :]  # every phase-2 call so far: cut short
        assert cut_2 and len(set(cut_2)) == len(cut_2)
        assert _batches(instance) == 3 and _pending(instance) == 6
        worker = instance.spawn("worker")
        # the new cluster's start, the sweep or the redelivery, the run's 4 s
        assert _wait(lambda: _pending(instance) == 0, 180), instance.log()[-4000:]
        time.sleep(LLM_DELAY + 2)  # a second run of a done scope would call the LLM now
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(60)
        instance.stop()

    # --- nothing lost, nothing done twice --------------------------------------------
    rows = instance.query(
        "SELECT s.path, p.status, p.attempts, p.batch_id FROM memory_engine_pendingupdate p "
        "JOIN memories_scope s ON s.id = p.scope_id"
    )
    assert len(rows) == 12 and {(r[1], r[2]) for r in rows} == {("done", 1)}
    per_scope: dict[tuple[str, ...], set[str]] = {}
    for scope, _status, _attempts, batch in rows:
        per_scope.setdefault(tuple(scope), set()).add(batch)
    assert {scope: len(b) for scope, b in per_scope.items()} == {
        tuple(s): 2 for s in SCOPES.values()
    }  # each phase's two flushes of a scope: one batch
    owner_id = instance.query("SELECT id FROM auth_user WHERE username = 'fault'")[0][0]
    for tag, scope in SCOPES.items():
        facts = sorted(
            r[0]
            for r in instance.query(
                "SELECT v.content FROM memories_fact v JOIN memories_factlink l "
                "ON l.fact_id = v.id JOIN memories_scope s ON s.id = l.scope_id "
                "WHERE s.owner_id = %s AND s.path = %s",
                [owner_id, scope],
            )
        )
        assert facts == sorted(f"User likes {thing}" for thing in told[tag])
        assert sorted(_journal_lines(instance, owner_id, scope)) == sorted(
            f"{tag} likes {thing}" for thing in told[tag]
        )  # each flush's entry once
    adds = instance.query("SELECT count(*) FROM memories_factchange WHERE action = 'add'")[0][0]
    assert adds == 12
    # LLM calls: one per scope and phase that committed, plus the ones the kills cut
    # short (at most one per killed worker process); none for a scope already done
    calls_1, calls_2 = Counter(phase_1), Counter(llm.scopes()[len(phase_1) :])
    tags = {"/".join(s) for s in SCOPES.values()}
    seen = (llm.arrivals, llm.others)
    assert calls_2 == Counter(tags) + Counter(cut_2), seen  # exact: counted after death
    assert set(calls_1) == tags and set(calls_1.values()) <= {1, 2}, seen
    assert 1 <= sum(calls_1.values()) - 3 <= len(killed), seen
