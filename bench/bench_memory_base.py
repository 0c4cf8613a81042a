"""Memory Base benchmark: capture -> committed chunks, and the pending count at 1M messages.

Run from the repository root, against a private database:

    EMBEDDED_DB_NAME=bench_mb .venv/bin/python bench/bench_memory_base.py \\
        [--messages N] [--local-messages N] [--embedder hashing|local|both] \\
        [--sessions 10] [--repeats 3] [--pending-rows 1000000] [--fresh] [--profile]

(``EMBEDDED_DB_NAME`` defaults to ``bench_mb`` here, so the bench never writes into
the development database by accident.) Migrations are applied first. Nothing is
written to files; the figures are printed.

1. End to end, per embedder (``hashing``: ``--messages`` outputs, default 20,000;
   ``local`` all-MiniLM-L6-v2: ``--local-messages``, default 2,000). A flow and a
   memory base (auto capture on, threshold 10**9 so that capture never queues a
   job: capture and ingestion are timed apart, and a job is never handed to the
   django-q broker) receive the outputs through ``messages_record``: one run per
   output, each run = a short user turn + one assistant output of 40-80 words,
   round-robin over ``--sessions`` sessions. Then every session is ingested inline
   (``session_ingest_enqueue(run_with=session_ingest_run)``: batches of 200 messages ->
   ``knowledge_base_ingest`` -> cursor). Ingestion is repeated ``--repeats`` times
   into fresh memory bases on the same flow (median reported). The embedder's own
   time is measured twice: inside ingestion (the embedder's ``embed`` wrapped with a
   timer) and directly, on exactly the batches ingestion passed to it (same texts,
   same batch sizes), ``--repeats`` times. Overhead = (ingestion - embedding) /
   embedding. With ``--profile`` (or when the overhead misses the 10 % target) one
   more ingestion runs with phase timers (Python phases and SQL by statement),
   then one under cProfile.
2. Pending count: ``--pending-rows`` messages (default 1,000,000) for one flow over
   ``--pending-sessions`` sessions (default 1,000), half of them outputs, bulk-loaded
   with INSERT ... SELECT generate_series (reused on later runs unless ``--fresh``),
   VACUUM ANALYZE; a session cursor is put in the middle of one session; the exact
   SQL of ``session_pending_count`` is captured and shown with
   EXPLAIN (ANALYZE, BUFFERS), with its median time over ``--pending-runs`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import io
import os
import platform
import pstats
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "memoryproject.settings"
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_mb")

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import override_settings  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

import ingestion.memory_bases as runner  # noqa: E402
import knowledge.services.ingest as ks  # noqa: E402
import memories.bases.services as capture  # noqa: E402
import memories.bases.services as mbs  # noqa: E402
import memories.conversations.services as convs  # noqa: E402
from core.providers.embeddings import _feature_slot  # noqa: E402
from knowledge.models import Chunk  # noqa: E402
from knowledge.selectors import kb_embedder  # noqa: E402
from memories.bases.models import (  # noqa: E402
    MemoryBase,
    MemoryBaseJob,  # noqa: E402
    MemoryBaseSession,
)
from memories.conversations.models import Flow, Message  # noqa: E402

TARGET_OVERHEAD = 0.10
NO_TRIGGER = 10**9
MODELS = {"hashing": "hashing-v1", "local": "sentence-transformers/all-MiniLM-L6-v2"}
E2E_USER = "bench-mb-e2e"
PENDING_USER = "bench-mb-pending"
PENDING_FLOW = "pending-load"

# --- synthetic conversation text ---------------------------------------------------
_TOPICS = {
    "travel": "flight hotel booking Lisbon itinerary passport layover train Porto museum "
    "reservation check-in luggage visa seat refund airport",
    "billing": "invoice payment card subscription refund plan upgrade discount receipt VAT "
    "charge renewal account balance transfer currency",
    "code": "function deploy container database migration index query timeout cache "
    "latency endpoint release rollback test pipeline branch",
    "health": "appointment doctor prescription allergy dosage symptoms clinic therapy "
    "insurance referral vaccine schedule blood pressure",
    "home": "landlord lease heating repair plumber deposit rent contract furniture "
    "electricity meter neighbour insurance garden kitchen",
    "work": "meeting deadline report manager quarterly roadmap hiring review budget "
    "presentation client proposal milestone standup",
}
_TOPIC_WORDS = {k: v.split() for k, v in _TOPICS.items()}
_OPENERS = [
    "Sure, here is what I found.",
    "Thanks for the details.",
    "I have checked this for you.",
    "Good question.",
    "Here is a short summary.",
    "I looked into it.",
]
_TEMPLATES = [
    "The {a} for your {b} is confirmed and I noted that you prefer the {c} option.",
    "You mentioned that the {a} should happen before the {b}, so I moved the {c} accordingly.",
    "I could not find a {a} linked to the {b}; you may want to contact them about the {c}.",
    "Your {a} changed last week, which affects the {b} and probably the {c} as well.",
    "Next step: review the {a}, then confirm the {b} by Friday so the {c} is not delayed.",
    "I saved a note that the {a} depends on the {b} and that the {c} is still open.",
    "Remember that the {a} costs more when the {b} is late, and the {c} has no grace period.",
    "The {a} and the {b} are both scheduled for Tuesday morning, right after the {c}.",
]
_CLOSERS = [
    "Let me know if you want me to change anything.",
    "Tell me if I should remind you later.",
    "I can draft a message if that helps.",
    "Anything else I should keep track of?",
]
_QUESTIONS = [
    "Can you check the {a} for me?",
    "What happened with the {a} and the {b}?",
    "Please remember my {a} preferences.",
    "Is the {a} still on for next week?",
    "Remind me what we decided about the {a}.",
]


def _fill(template: str, words: list[str], rng: random.Random) -> str:
    a, b, c = rng.sample(words, 3)
    return template.format(a=a, b=b, c=c)


def assistant_text(rng: random.Random, topic: str) -> str:
    """An assistant output of 40-80 words about ``topic``."""
    words = _TOPIC_WORDS[topic]
    target = rng.randint(40, 80)
    parts = [rng.choice(_OPENERS)]
    count = len(parts[0].split())
    while count < target - 8:
        sentence = _fill(rng.choice(_TEMPLATES), words, rng)
        parts.append(sentence)
        count += len(sentence.split())
    closer = rng.choice(_CLOSERS)
    parts.append(closer)
    text = " ".join(parts)
    return " ".join(text.split()[:80])


def user_text(rng: random.Random, topic: str) -> str:
    return _fill(rng.choice(_QUESTIONS), _TOPIC_WORDS[topic], rng)


# --- helpers -----------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def machine() -> dict[str, str]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        free = subprocess.run(["free", "-h"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        free = "?"
    with connection.cursor() as cur:
        cur.execute("SHOW server_version")
        pg = cur.fetchone()[0]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "free": free.rstrip(),
        "python": platform.python_version(),
        "postgres": pg,
    }


def vacuum(table: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"VACUUM ANALYZE {table}")


def bench_user(username: str) -> Any:
    user, _ = get_user_model().objects.get_or_create(username=username)
    return user


def delete_memory_bases(qs: Any) -> None:
    for mb in qs.select_related("knowledge_base"):
        mbs.memory_base_delete(memory_base=mb, wait_seconds=0)


def clear_e2e_data(user: Any) -> None:
    delete_memory_bases(MemoryBase.objects.filter(owner=user))
    with connection.cursor() as cur:
        cur.execute("DELETE FROM ingestion_message WHERE owner_id = %s", [user.pk])
    Flow.objects.filter(owner=user).delete()
    vacuum("ingestion_message")
    vacuum("knowledge_chunk")


# --- 1. end to end -----------------------------------------------------------------
class EmbedTimer:
    """Wrap an embedder instance's ``embed``: total time and the exact batches."""

    def __init__(self, embedder: Any):
        self.embedder = embedder
        self.seconds = 0.0
        self.batches: list[list[str]] = []

    def __enter__(self) -> EmbedTimer:
        original = self.embedder.embed

        def timed(texts: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(texts)
            finally:
                self.seconds += time.perf_counter() - start
                self.batches.append(list(texts))

        self.embedder.embed = timed
        return self

    def __exit__(self, *exc: object) -> None:
        del self.embedder.embed


def ingest_all(memory_base: MemoryBase, session_ids: list[str]) -> list[MemoryBaseJob]:
    jobs = []
    for session_id in session_ids:
        session = mbs.memory_base_session_ensure(memory_base=memory_base, session_id=session_id)
        job = mbs.session_ingest_enqueue(
            session=session,
            trigger=MemoryBaseJob.Trigger.MANUAL,
            run_with=runner.session_ingest_run,
        )
        if job is None or job.status != MemoryBaseJob.Status.SUCCEEDED:
            raise RuntimeError(f"ingestion of {session_id} did not succeed: {job and job.error}")
        jobs.append(job)
    return jobs


def check_committed(memory_base: MemoryBase, outputs: int, texts: set[str]) -> None:
    chunks = Chunk.objects.filter(knowledge_base_id=memory_base.knowledge_base_id)
    found = chunks.count()
    if found != outputs:
        raise RuntimeError(f"expected {outputs} committed chunks, found {found}")
    pending = sum(
        mbs.session_pending_count(session=s)
        for s in memory_base.sessions.select_related("memory_base")
    )
    if pending:
        raise RuntimeError(f"{pending} outputs still pending after ingestion")
    sample = set(chunks.order_by("?").values_list("text", flat=True)[:50])
    if not sample <= texts:
        raise RuntimeError("committed chunk texts differ from the captured outputs")


def new_memory_base(user: Any, flow: Flow, name: str) -> MemoryBase:
    return mbs.memory_base_create(owner=user, name=name, flow=flow, threshold=NO_TRIGGER)


def run_e2e(
    provider: str, outputs: int, sessions: int, repeats: int, profile: bool, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    user = bench_user(E2E_USER)
    clear_e2e_data(user)
    flow = convs.flow_create(owner=user, name=f"e2e-{provider}")
    session_ids = [f"{provider}-session-{i:03d}" for i in range(sessions)]
    topics = list(_TOPICS)
    runs = []
    for i in range(outputs):
        topic = topics[(i // sessions) % len(topics)] if i % 3 else rng.choice(topics)
        runs.append(
            (
                session_ids[i % sessions],
                f"run-{i:06d}",
                [
                    convs.MessageIn(role="user", text=user_text(rng, topic)),
                    convs.MessageIn(role="assistant", text=assistant_text(rng, topic)),
                ],
            )
        )
    output_texts = {r[2][1].text for r in runs}
    words = [len(r[2][1].text.split()) for r in runs]

    result: dict[str, Any] = {
        "provider": provider,
        "outputs": outputs,
        "messages": 2 * outputs,
        "sessions": sessions,
        "words_median": median(words),
    }
    settings_override = override_settings(
        EMBEDDING_PROVIDER=provider, EMBEDDING_MODEL=MODELS[provider], EMBEDDING_DIMENSIONS=384
    )
    with settings_override:
        memory_base = new_memory_base(user, flow, f"mb-{provider}-0")
        kb = memory_base.knowledge_base
        assert kb.embedding_provider == provider, kb.embedding_provider
        embedder = kb_embedder(kb)
        load_start = time.perf_counter()
        embedder.embed(["warm-up text for the embedder"] * 8)  # loads the local model
        result["embedder_load_s"] = time.perf_counter() - load_start

        start = time.perf_counter()
        for session_id, run_id, messages in runs:
            capture.messages_record(
                flow=flow, session_id=session_id, run_id=run_id, messages=messages
            )
        result["capture_s"] = time.perf_counter() - start
        if MemoryBaseJob.objects.filter(memory_base=memory_base).exists():
            raise RuntimeError("capture queued a job: the threshold should prevent it")
        vacuum("ingestion_message")

        # Each ingestion is followed by the direct embedding of the same batches, so the
        # two see the same machine load (it is shared and noisy).
        ingest_s, inline_embed_s, direct_s, batches = [], [], [], None
        for rep in range(repeats):
            if rep:
                memory_base = new_memory_base(user, flow, f"mb-{provider}-{rep}")
            _feature_slot.cache_clear()
            with EmbedTimer(embedder) as timer:
                start = time.perf_counter()
                jobs = ingest_all(memory_base, session_ids)
                ingest_s.append(time.perf_counter() - start)
            inline_embed_s.append(timer.seconds)
            batches = batches or timer.batches
            check_committed(memory_base, outputs, output_texts)
            result["jobs"] = len(jobs)
            result["chunks"] = sum(j.chunks_written for j in jobs)
            _feature_slot.cache_clear()
            start = time.perf_counter()
            for texts in batches:
                embedder.embed(texts)
            direct_s.append(time.perf_counter() - start)
            print(
                f"  [{provider}] repeat {rep + 1}/{repeats}: ingestion {ingest_s[-1]:.2f} s "
                f"(embedder inside {timer.seconds:.2f} s), embedder alone {direct_s[-1]:.2f} s",
                flush=True,
            )
            delete_memory_bases(MemoryBase.objects.filter(pk=memory_base.pk))
            vacuum("knowledge_chunk")

        assert batches is not None
        result.update(
            ingest_s=median(ingest_s),
            ingest_all_s=ingest_s,
            inline_embed_s=median(inline_embed_s),
            inline_overhead=median([(i - e) / e for i, e in zip(ingest_s, inline_embed_s)]),
            paired_overhead=median([(i - d) / d for i, d in zip(ingest_s, direct_s)]),
            direct_embed_s=median(direct_s),
            direct_all_s=direct_s,
            embed_calls=len(batches),
            embed_batch_sizes=sorted(Counter(len(b) for b in batches).items()),
        )
        result["overhead"] = (result["ingest_s"] - result["direct_embed_s"]) / result[
            "direct_embed_s"
        ]
        if profile or result["overhead"] > TARGET_OVERHEAD:
            memory_base = new_memory_base(user, flow, f"mb-{provider}-phases")
            _feature_slot.cache_clear()
            result["phases"] = profile_phases(memory_base, session_ids, embedder)
            result["write_probe"] = write_probe(memory_base, embedder)
            delete_memory_bases(MemoryBase.objects.filter(pk=memory_base.pk))
            vacuum("knowledge_chunk")
            memory_base = new_memory_base(user, flow, f"mb-{provider}-cprofile")
            _feature_slot.cache_clear()
            result["cprofile"] = profile_cprofile(memory_base, session_ids)
            delete_memory_bases(MemoryBase.objects.filter(pk=memory_base.pk))
            memory_base = new_memory_base(user, flow, f"mb-{provider}-capture")
            result["capture_phases"] = profile_capture(flow, runs[: min(len(runs), 1000)])
            result["capture_cprofile"] = profile_capture_cprofile(flow, runs[:500])
            delete_memory_bases(MemoryBase.objects.filter(pk=memory_base.pk))
    return result


# --- phase timers (low overhead, no cProfile) ----------------------------------------
_SQL_TABLE = re.compile(r'(?:FROM|INTO|UPDATE|TABLE(?: IF NOT EXISTS)?)\s+"?(\w+)"?', re.I)


def sql_label(sql: str) -> str:
    text = " ".join(sql.split())
    verb = text.split(" ", 1)[0].upper()
    if verb == "SELECT" and "pg_advisory_xact_lock" in text:
        return "SELECT pg_advisory_xact_lock"
    if verb == "SELECT" and "FOR UPDATE" in text:
        verb = "SELECT FOR UPDATE"
    if verb == "SELECT" and "COUNT(*)" in text.upper() and "ingestion_message" in text:
        verb = "SELECT COUNT"
    if text.startswith("INSERT INTO knowledge_chunk"):
        return "INSERT knowledge_chunk ... ON CONFLICT (upsert from stage)"
    if text.startswith("UPDATE knowledge_knowledgebase"):
        return "UPDATE knowledge_knowledgebase (counters + DISTINCT source_type)"
    if text.startswith("DELETE FROM knowledge_chunk c"):
        return "DELETE knowledge_chunk NOT EXISTS stage (stale chunks)"
    if verb in ("SAVEPOINT", "RELEASE", "ROLLBACK"):
        return f"{verb} (savepoint)"
    match = _SQL_TABLE.search(text)
    return f"{verb} {match.group(1)}" if match else text[:50]


class Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self._restore: list[tuple[Any, str, Any]] = []

    def add(self, label: str, seconds: float) -> None:
        self.seconds[label] += seconds
        self.calls[label] += 1

    @contextlib.contextmanager
    def timed(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(label, time.perf_counter() - start)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.timed(label):
                return original(*args, **kwargs)

        own = not isinstance(owner, type) and name in getattr(owner, "__dict__", {})
        is_module = isinstance(owner, type(sys))
        self._restore.append((owner, name, original if (own or is_module) else None))
        setattr(owner, name, wrapper)

    def restore(self) -> None:
        for owner, name, original in reversed(self._restore):
            if original is None:  # was a bound method from the class: drop the shadow
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._restore.clear()


class _TimedCopy:
    def __init__(self, copy_cm: Any, phases: Phases):
        self._cm, self._phases = copy_cm, phases

    def __enter__(self) -> Any:
        self._start = time.perf_counter()
        return self._cm.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self._cm.__exit__(*exc)
        finally:
            self._phases.add(
                "SQL raw: COPY knowledge_chunk_stage (binary)", time.perf_counter() - self._start
            )


class _TimedCursor:
    def __init__(self, cursor: Any, phases: Phases):
        self._cur, self._phases = cursor, phases

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def __enter__(self) -> _TimedCursor:
        self._cur.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._cur.__exit__(*exc)

    def execute(self, sql: str, params: Any = None) -> _TimedCursor:
        with self._phases.timed("SQL raw: " + sql_label(sql)):
            self._cur.execute(sql, params)
        return self

    def copy(self, statement: str) -> _TimedCopy:
        return _TimedCopy(self._cur.copy(statement), self._phases)


class _TimedConnection:
    def __init__(self, raw: Any, phases: Phases):
        self._raw, self._phases = raw, phases

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def cursor(self, *args: Any, **kwargs: Any) -> _TimedCursor:
        return _TimedCursor(self._raw.cursor(*args, **kwargs), self._phases)


def profile_phases(
    memory_base: MemoryBase, session_ids: list[str], embedder: Any
) -> dict[str, Any]:
    phases = Phases()
    for name, label in [
        ("job_claim", "runner.job_claim"),
        ("_scope", "runner._scope"),
        ("_cancelled", "runner._cancelled (cancel polls)"),
        ("_batch_to_documents", "runner._batch_to_documents"),
        ("knowledge_base_ingest", "ks.knowledge_base_ingest"),
        ("session_cursor_advance", "mbs.session_cursor_advance"),
        ("job_finish", "runner.job_finish"),
        ("session_ingest_run", "runner.session_ingest_run"),
    ]:
        phases.wrap(runner, name, label)
    phases.wrap(mbs, "memory_base_session_ensure", "mbs.memory_base_session_ensure")
    for name, label in [
        ("_chunk_documents", "ks._chunk_documents"),
        ("_stage_row", "ks._stage_row (per chunk)"),
        ("_write_chunks", "ks._write_chunks"),
    ]:
        phases.wrap(ks, name, label)
    phases.wrap(embedder, "embed", "embedder.embed")
    phases.wrap(connection, "_commit", "COMMIT (all transactions)")
    raw_connection = ks._raw_connection
    ks._raw_connection = lambda: _TimedConnection(raw_connection(), phases)

    def django_sql(execute: Callable, sql: str, params: Any, many: bool, context: Any) -> Any:
        with phases.timed("SQL django: " + sql_label(sql)):
            return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(django_sql):
            start = time.perf_counter()
            ingest_all(memory_base, session_ids)
            total = time.perf_counter() - start
    finally:
        ks._raw_connection = raw_connection
        phases.restore()
    return {"total": total, "seconds": dict(phases.seconds), "calls": dict(phases.calls)}


class _Rollback(Exception):
    pass


def write_probe(memory_base: MemoryBase, embedder: Any, reps: int = 5) -> dict[str, Any]:
    """Time ``_write_chunks`` for one 200-message batch of new chunks, rolled back:
    384 dimensions (inside the partial HNSW index) vs the same rows cut to 383
    dimensions (outside every HNSW index), alternating, medians."""
    kb = memory_base.knowledge_base
    flow_id = memory_base.flow_id
    batch = list(
        Message.objects.filter(flow_id=flow_id, is_output=True).order_by("created_at", "id")[
            : runner.INGEST_BATCH_MESSAGES
        ]
    )
    docs = [
        dataclasses.replace(d, source_key="probe:" + d.source_key)
        for d in runner._batch_to_documents(memory_base, batch)
    ]
    rows = ks._chunk_documents(kb, docs)
    vectors = embedder.embed([r.text for r in rows])
    stage_384 = [ks._stage_row(kb, r, v) for r, v in zip(rows, vectors)]
    stage_383 = [t[:3] + (t[3][:383],) + t[4:] for t in stage_384]
    keys = [d.source_key for d in docs]
    no_hnsw = SimpleNamespace(pk=kb.pk, language=kb.language, embedding_dimensions=383)
    variants = {"384 (HNSW)": (kb, stage_384), "383 (no HNSW)": (no_hnsw, stage_383)}
    seconds: dict[str, list[float]] = defaultdict(list)
    upsert: dict[str, list[float]] = defaultdict(list)
    raw_connection = ks._raw_connection
    try:
        for _ in range(reps):
            for name, (target, stage) in variants.items():
                phases = Phases()
                ks._raw_connection = lambda p=phases: _TimedConnection(raw_connection(), p)
                try:
                    with transaction.atomic():
                        start = time.perf_counter()
                        ks._write_chunks(target, stage, keys)
                        seconds[name].append(time.perf_counter() - start)
                        raise _Rollback
                except _Rollback:
                    pass
                upsert[name].append(sum(v for k, v in phases.seconds.items() if "ON CONFLICT" in k))
    finally:
        ks._raw_connection = raw_connection
    return {
        "rows": len(stage_384),
        "chunks_in_table": Chunk.objects.filter(knowledge_base_id=kb.pk).count(),
        "write_s": {k: median(v) for k, v in seconds.items()},
        "upsert_s": {k: median(v) for k, v in upsert.items()},
    }


def profile_capture(flow: Flow, runs: list[tuple[str, str, list[Any]]]) -> dict[str, Any]:
    """Capture ``runs`` again (into new sessions) with every SQL statement timed."""
    phases = Phases()
    phases.wrap(connection, "_commit", "COMMIT")

    def django_sql(execute: Callable, sql: str, params: Any, many: bool, context: Any) -> Any:
        with phases.timed("SQL django: " + sql_label(sql)):
            return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(django_sql):
            start = time.perf_counter()
            for session_id, run_id, messages in runs:
                capture.messages_record(
                    flow=flow, session_id=session_id + "-p", run_id=run_id, messages=messages
                )
            total = time.perf_counter() - start
    finally:
        phases.restore()
    return {
        "runs": len(runs),
        "total": total,
        "seconds": dict(phases.seconds),
        "calls": dict(phases.calls),
    }


def profile_capture_cprofile(flow: Flow, runs: list[tuple[str, str, list[Any]]]) -> dict[str, Any]:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for session_id, run_id, messages in runs:
        capture.messages_record(
            flow=flow, session_id=session_id + "-c", run_id=run_id, messages=messages
        )
    profiler.disable()
    total = time.perf_counter() - start
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
    return {"total": total, "runs": len(runs), "text": out.getvalue()}


def profile_cprofile(memory_base: MemoryBase, session_ids: list[str]) -> dict[str, Any]:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    ingest_all(memory_base, session_ids)
    profiler.disable()
    total = time.perf_counter() - start
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(18)
    return {"total": total, "text": out.getvalue()}


# --- 2. pending count at 1M messages -------------------------------------------------
_LOAD_SQL = """
INSERT INTO ingestion_message (owner_id, flow_id, session_id, run_id, is_output, role,
    sender, sender_name, text, content, files, parent_message_id, created_at)
SELECT %(owner)s, %(flow)s,
       'sess-' || lpad(((g / 2) %% %(sessions)s)::text, 5, '0'),
       'run-' || (g / 2),
       g %% 2 = 1,
       CASE WHEN g %% 2 = 1 THEN 'assistant' ELSE 'user' END,
       CASE WHEN g %% 2 = 1 THEN 'assistant' ELSE 'user' END,
       '',
       CASE WHEN g %% 2 = 1 THEN (%(outputs)s::text[])[1 + (g / 2) %% %(k)s]
            ELSE (%(questions)s::text[])[1 + (g / 2) %% %(k)s] END,
       '[]'::jsonb, '[]'::jsonb, NULL,
       %(t0)s::timestamptz + (g / 2) * interval '20 milliseconds'
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""


def load_pending_rows(user: Any, flow: Flow, rows: int, sessions: int) -> float:
    rng = random.Random(7)
    topics = list(_TOPICS)
    k = 500
    outputs = [assistant_text(rng, topics[i % len(topics)]) for i in range(k)]
    questions = [user_text(rng, topics[i % len(topics)]) for i in range(k)]
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    step = 100_000
    start = time.perf_counter()
    for lo in range(0, rows, step):
        hi = min(lo + step, rows) - 1
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                _LOAD_SQL,
                {
                    "owner": user.pk,
                    "flow": flow.pk,
                    "sessions": sessions,
                    "outputs": outputs,
                    "questions": questions,
                    "k": k,
                    "t0": t0,
                    "lo": lo,
                    "hi": hi,
                },
            )
        print(
            f"  loaded {hi + 1:,} / {rows:,} rows ({time.perf_counter() - start:.0f} s)", flush=True
        )
    elapsed = time.perf_counter() - start
    vacuum("ingestion_message")
    return elapsed


def run_pending(rows: int, sessions: int, runs: int, fresh: bool) -> dict[str, Any]:
    user = bench_user(PENDING_USER)
    flow, _ = Flow.objects.get_or_create(owner=user, name=PENDING_FLOW)
    existing = Message.objects.filter(flow=flow).count()
    session_count = (
        Message.objects.filter(flow=flow).values("session_id").distinct().count() if existing else 0
    )
    result: dict[str, Any] = {"rows": rows, "sessions": sessions}
    if fresh or existing != rows or session_count != sessions:
        print(
            f"  loading {rows:,} messages over {sessions:,} sessions (had {existing:,})", flush=True
        )
        delete_memory_bases(MemoryBase.objects.filter(flow=flow))
        with connection.cursor() as cur:
            cur.execute("DELETE FROM ingestion_message WHERE flow_id = %s", [flow.pk])
        result["load_s"] = load_pending_rows(user, flow, rows, sessions)
    else:
        print(f"  reusing {existing:,} loaded messages", flush=True)
        vacuum("ingestion_message")
    with override_settings(
        EMBEDDING_PROVIDER="hashing", EMBEDDING_MODEL=MODELS["hashing"], EMBEDDING_DIMENSIONS=384
    ):
        memory_base = MemoryBase.objects.filter(flow=flow).first() or mbs.memory_base_create(
            owner=user, name="pending-load", flow=flow, threshold=NO_TRIGGER
        )
    session_id = f"sess-{sessions // 2:05d}"
    session = mbs.memory_base_session_ensure(memory_base=memory_base, session_id=session_id)
    outputs = list(
        Message.objects.filter(flow=flow, session_id=session_id, is_output=True)
        .order_by("created_at", "id")
        .values_list("created_at", "id")
    )
    cursor_at, cursor_id = outputs[len(outputs) // 2]
    MemoryBaseSession.objects.filter(pk=session.pk).update(
        cursor_created_at=cursor_at, cursor_message_id=cursor_id
    )
    session = MemoryBaseSession.objects.select_related("memory_base").get(pk=session.pk)
    expected = len(outputs) - len(outputs) // 2 - 1
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE is_output), "
            "pg_size_pretty(pg_relation_size('ingestion_message')), "
            "pg_size_pretty(pg_relation_size('message_pending_outputs')) "
            "FROM ingestion_message WHERE flow_id = %s",
            [flow.pk],
        )
        total_rows, total_outputs, heap_size, index_size = cur.fetchone()
    result.update(
        total_rows=total_rows,
        total_outputs=total_outputs,
        heap_size=heap_size,
        index_size=index_size,
        session_id=session_id,
        session_outputs=len(outputs),
    )

    with CaptureQueriesContext(connection) as captured:
        count = mbs.session_pending_count(session=session)
    sql = captured.captured_queries[-1]["sql"]
    if count != expected:
        raise RuntimeError(f"pending count {count}, expected {expected}")
    result.update(pending=count, sql=sql)

    with connection.cursor() as cur:
        for _ in range(5):  # warm the buffers the way a running service has them
            cur.execute(sql)
            cur.fetchall()
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
        plan = "\n".join(row[0] for row in cur.fetchall())
    result["plan"] = plan

    orm_ms, raw_ms, server_ms = [], [], []
    for _ in range(runs):
        start = time.perf_counter()
        mbs.session_pending_count(session=session)
        orm_ms.append((time.perf_counter() - start) * 1000)
    with connection.cursor() as cur:
        for _ in range(runs):
            start = time.perf_counter()
            cur.execute(sql)
            cur.fetchall()
            raw_ms.append((time.perf_counter() - start) * 1000)
        for _ in range(runs):
            cur.execute("EXPLAIN (ANALYZE, TIMING OFF) " + sql)
            text = "\n".join(row[0] for row in cur.fetchall())
            server_ms.append(float(re.search(r"Execution Time: ([\d.]+) ms", text).group(1)))
    # For comparison only: the same count with the cursor's leading column also as a
    # plain range condition, which the planner can use as an Index Cond.
    with CaptureQueriesContext(connection) as captured:
        alt_count = (
            mbs._outputs_after_cursor(session).filter(created_at__gte=session.cursor_created_at)
        ).count()
    alt_sql = captured.captured_queries[-1]["sql"]
    assert alt_count == count
    alt_ms = []
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + alt_sql)
        alt_plan = "\n".join(row[0] for row in cur.fetchall())
        for _ in range(runs):
            cur.execute("EXPLAIN (ANALYZE, TIMING OFF) " + alt_sql)
            text = "\n".join(row[0] for row in cur.fetchall())
            alt_ms.append(float(re.search(r"Execution Time: ([\d.]+) ms", text).group(1)))
    result.update(alt_plan=alt_plan, alt_server_ms=median(alt_ms))
    result.update(
        orm_ms=median(orm_ms),
        orm_p95_ms=sorted(orm_ms)[int(0.95 * (runs - 1))],
        raw_ms=median(raw_ms),
        server_ms=median(server_ms),
        index_only=bool(re.search(r"Index Only Scan using message_pending_outputs", plan)),
        heap_fetches=[int(x) for x in re.findall(r"Heap Fetches: (\d+)", plan)],
        cursor_in_index_cond=bool(re.search(r"Index Cond:.*created_at", plan)),
        rows_removed=[int(x) for x in re.findall(r"Rows Removed by Filter: (\d+)", plan)],
    )
    return result


# --- report ------------------------------------------------------------------------
def print_e2e(r: dict[str, Any]) -> None:
    n, capture, ingest = r["outputs"], r["capture_s"], r["ingest_s"]
    print(f"\n== End to end: {r['provider']} embedder ==")
    print(
        f"  data: {n:,} runs (user turn + assistant output of median {r['words_median']:.0f} "
        f"words) = {r['messages']:,} messages, {r['sessions']} sessions; "
        f"{r['jobs']} jobs, {r['chunks']:,} chunks"
    )
    print(f"  embedder load + warm-up: {r['embedder_load_s']:.2f} s (not counted)")
    print(
        f"  capture (messages_record): {capture:.2f} s = {n / capture:,.0f} runs/s = "
        f"{2 * n / capture:,.0f} messages/s ({capture / n * 1000:.2f} ms/run)"
    )
    print(
        f"  ingestion (median of {len(r['ingest_all_s'])}: "
        f"{', '.join(f'{x:.2f}' for x in r['ingest_all_s'])} s): {ingest:.2f} s = "
        f"{n / ingest:,.0f} outputs/s"
    )
    print(
        f"  end to end, capture -> committed chunks: {capture + ingest:.2f} s = "
        f"{n / (capture + ingest):,.0f} outputs/s ({2 * n / (capture + ingest):,.0f} messages/s)"
    )
    print(
        f"  embedder alone, same {r['embed_calls']} batches {r['embed_batch_sizes']} "
        f"(median of {', '.join(f'{x:.2f}' for x in r['direct_all_s'])} s): "
        f"{r['direct_embed_s']:.2f} s = {n / r['direct_embed_s']:,.0f} texts/s"
    )
    print(f"  embedder inside ingestion: {r['inline_embed_s']:.2f} s")
    verdict = "MET" if r["overhead"] <= TARGET_OVERHEAD else "NOT MET"
    print(
        f"  pipeline overhead (ingestion - embedder) / embedder: {r['overhead']:+.1%} from the "
        f"medians; per repeat, median: {r['paired_overhead']:+.1%} vs the embedder alone right "
        f"after, {r['inline_overhead']:+.1%} vs the embedder's time inside that ingestion "
        f"-> target <= 10%: {verdict}"
    )
    if "phases" in r:
        print_phases(r["phases"], r["inline_embed_s"])
    if "write_probe" in r:
        w = r["write_probe"]
        print(
            f"  write probe, one batch of {w['rows']} new chunks, rolled back, table holding "
            f"{w['chunks_in_table']:,} chunks of this base (median of 5):"
        )
        for name, seconds in w["write_s"].items():
            print(
                f"    dimensions {name}: _write_chunks {seconds * 1000:.0f} ms, of which upsert "
                f"{w['upsert_s'][name] * 1000:.0f} ms ({seconds / w['rows'] * 1000:.2f} ms/chunk)"
            )
    if "capture_phases" in r:
        c = r["capture_phases"]
        per_run = c["total"] / c["runs"] * 1000
        print(
            f"  capture with SQL timers, {c['runs']} more runs: {per_run:.2f} ms/run; "
            "per statement kind (ms/run, calls/run):"
        )
        sql_total = 0.0
        for label, seconds in sorted(c["seconds"].items(), key=lambda kv: -kv[1]):
            sql_total += seconds
            print(
                f"    {seconds / c['runs'] * 1000:6.3f} ms  {c['calls'][label] / c['runs']:4.1f}  "
                f"{label}"
            )
        print(
            f"    {(c['total'] - sql_total) / c['runs'] * 1000:6.3f} ms        Python outside "
            "SQL (ORM, transaction, on_commit)"
        )
    if "cprofile" in r:
        print(f"  cProfile of one more ingestion ({r['cprofile']['total']:.2f} s with profiler):")
        print_stats_text(r["cprofile"]["text"])
    if "capture_cprofile" in r:
        c = r["capture_cprofile"]
        print(
            f"  cProfile of {c['runs']} more captures ({c['total'] / c['runs'] * 1000:.2f} ms/run "
            "with profiler):"
        )
        print_stats_text(c["text"])


def print_stats_text(text: str) -> None:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    for line in lines[start:]:
        print("    " + line.replace(str(ROOT) + "/.venv/lib/python3.11/site-packages/", "")[:150])


def print_phases(p: dict[str, Any], embed_s: float) -> None:
    total = p["total"]
    print(f"  phase timers on one more ingestion ({total:.2f} s; times are inclusive):")
    rows = sorted(p["seconds"].items(), key=lambda kv: -kv[1])
    for label, seconds in rows:
        print(f"    {seconds:8.3f} s {seconds / total:6.1%} {p['calls'][label]:>7,} calls  {label}")


def print_pending(r: dict[str, Any]) -> None:
    print(f"\n== Pending count at {r['total_rows']:,} messages ==")
    if "load_s" in r:
        print(f"  bulk load: {r['load_s']:.1f} s ({r['total_rows'] / r['load_s']:,.0f} rows/s)")
    print(
        f"  {r['total_rows']:,} messages ({r['total_outputs']:,} outputs) in one flow over "
        f"{r['sessions']:,} sessions; heap {r['heap_size']}, message_pending_outputs "
        f"{r['index_size']}"
    )
    print(
        f"  session {r['session_id']}: {r['session_outputs']} outputs, cursor in the middle, "
        f"pending = {r['pending']}"
    )
    print(f"  SQL: {r['sql']}")
    print("  EXPLAIN (ANALYZE, BUFFERS):")
    for line in r["plan"].splitlines():
        print("    " + line)
    print(
        f"  time, median of runs: session_pending_count() {r['orm_ms']:.3f} ms "
        f"(p95 {r['orm_p95_ms']:.3f}), raw SQL round trip {r['raw_ms']:.3f} ms, "
        f"server execution {r['server_ms']:.3f} ms"
    )
    print(
        f"  Index Only Scan on message_pending_outputs: {'yes' if r['index_only'] else 'NO'}; "
        f"heap fetches {r['heap_fetches']}; cursor condition in Index Cond: "
        f"{'yes' if r['cursor_in_index_cond'] else 'no'}; rows removed by filter "
        f"{r['rows_removed'] or 0}"
    )
    print(
        "  for comparison, the same count plus created_at >= cursor_created_at "
        f"(server execution {r['alt_server_ms']:.3f} ms):"
    )
    for line in r["alt_plan"].splitlines():
        print("    " + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="hashing: outputs captured")
    parser.add_argument("--local-messages", type=int, default=2_000, help="local: outputs")
    parser.add_argument("--embedder", choices=["hashing", "local", "both", "none"], default="both")
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="phase timers + cProfile always")
    parser.add_argument("--pending-rows", type=int, default=1_000_000, help="0 to skip")
    parser.add_argument("--pending-sessions", type=int, default=1_000)
    parser.add_argument("--pending-runs", type=int, default=50)
    parser.add_argument("--fresh", action="store_true", help="reload the pending-count rows")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    info = machine()
    print(
        f"Memory Base benchmark, {info['date']}; nproc {info['nproc']}, {info['cpu']}; "
        f"Python {info['python']}, PostgreSQL {info['postgres']}; "
        f"database {connection.settings_dict['NAME']}"
    )
    print(info["free"])

    providers = {"both": ["hashing", "local"], "none": []}.get(args.embedder, [args.embedder])
    for provider in providers:
        outputs = args.messages if provider == "hashing" else args.local_messages
        print(f"\n-- {provider}: capturing {outputs:,} runs ...", flush=True)
        result = run_e2e(provider, outputs, args.sessions, args.repeats, args.profile, args.seed)
        print_e2e(result)
    if args.pending_rows:
        print("\n-- pending count ...", flush=True)
        print_pending(
            run_pending(args.pending_rows, args.pending_sessions, args.pending_runs, args.fresh)
        )


if __name__ == "__main__":
    main()
