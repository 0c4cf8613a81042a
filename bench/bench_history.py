"""Conversation and node memory history latency (service-side, no HTTP).

Run from the repository root, against a private database:

    EMBEDDED_DB_NAME=bench_history EMBEDDING_PROVIDER=hashing \\
        .venv/bin/python bench/bench_history.py [--messages 10000] [--calls 200] [--fresh]

(both variables default to those values here, so the bench never writes into the
development database). Migrations are applied to that database if needed; the
conversation is built once and reused (``--fresh`` rebuilds it). Node memory
documents go to a temporary directory that is removed at the end.

Data: a chat of ``--messages`` messages with branches, as a chat UI makes them:
each user message follows the current assistant answer; 10% of answers are
regenerated (a sibling answer to the same user message, and the chat continues
from it) and 5% of user messages are edited (a sibling user message under the same
answer). User messages have 8-40 words, answers 20-120 (about 1.3 tokens a word).
Every message records its parent. Node memory gets the same shape as 5,000 turns
(``--messages`` / 2): regenerated turns are siblings of the turn they replace.

Reported, p50/p99 (and mean) over ``--calls`` calls after 10 warm-up calls, for a
history cut to ``--max-tokens`` (2,000):

* conversation memory, ``memories.conversations.history.conversation_history``: from the
  newest message, and from a message in the middle (``current_message_id``); the
  default ``message_limit`` (500) bounds the candidates;
* node memory, ``memories.conversations.node_memory.node_memory_history``: the document stored
  plain and gzipped (default threshold 64 KiB); cold (the process's parsed-document
  cache emptied before every call: read + decompress + ``json.loads`` + thread),
  the parse alone, and warm (the bytes are read and checksummed, the parse reused);
  and appending one turn (a locked read-modify-write of the whole document), over
  min(``--calls``, 50) appends.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_history")
os.environ.setdefault("EMBEDDING_PROVIDER", "hashing")

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import override_settings  # noqa: E402

from memories.conversations import node_memory  # noqa: E402
from memories.conversations.history import conversation_history  # noqa: E402
from memories.conversations.models import Flow, Message
from memories.conversations.node_memory import documents as node_documents  # noqa: E402

SESSION = "bench-10k"
WORDS = (
    "the a to of and in is it you that for on with as was be this have are not but they at "
    "what so if can about from will your there which one all would their an my by do more "
    "memory model token budget thread branch answer question context history window prompt "
    "train Lisbon Porto ticket weather museum restaurant river deploy database index query "
    "latency schedule invoice customer meeting Thursday project review design cache storage"
).split()


def log(message: str) -> None:
    print(message, flush=True)


def migrate_if_needed() -> None:
    bench_db.migrate_if_needed(log)


def sentence(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def chat_shape(n: int, seed: int = 7) -> list[tuple[int, int | None, str, str]]:
    """(index, parent index, role, text) for ``n`` messages with regenerations/edits."""
    rng = random.Random(seed)
    out: list[tuple[int, int | None, str, str]] = []
    answer: int | None = None  # the current assistant message
    question: int | None = None  # the user message it answers
    while len(out) < n:
        if question is not None and rng.random() < 0.10:  # regenerate the answer
            out.append((len(out), question, "assistant", sentence(rng, 20, 120)))
            answer = len(out) - 1
            continue
        edit = question is not None and rng.random() < 0.05
        parent = out[question][1] if edit and question is not None else answer
        out.append((len(out), parent, "user", sentence(rng, 8, 40)))
        question = len(out) - 1
        if len(out) < n:
            out.append((len(out), question, "assistant", sentence(rng, 20, 120)))
            answer = len(out) - 1
    return out


def build_conversation(flow: Flow, n: int) -> None:
    shape = chat_shape(n)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT nextval(pg_get_serial_sequence('ingestion_message', 'id')) "
            "FROM generate_series(1, %s)",
            [n],
        )
        ids = [row[0] for row in cur.fetchall()]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        Message(
            id=ids[i],
            owner_id=flow.owner_id,
            flow=flow,
            session_id=SESSION,
            run_id=f"r{i}",
            is_output=role != "user",
            role=role,
            sender=role,
            text=text,
            parent_id=ids[p] if p is not None else None,
            created_at=start + timedelta(seconds=i),
        )
        for i, p, role, text in shape
    ]
    with transaction.atomic():
        Message.objects.bulk_create(rows, batch_size=2000)
    with connection.cursor() as cur:
        cur.execute("ANALYZE ingestion_message")


def build_node_memory(flow: Flow, n: int) -> None:
    """The same chat as turns: each turn is a (user, answer) pair of the shape above,
    a regenerated answer a sibling turn under the same parent turn."""
    rng = random.Random(11)
    turns: list[node_memory.TurnIn] = []
    current: int | None = None
    parents: list[int | None] = []
    while 2 * len(turns) < n:
        regenerate = turns and rng.random() < 0.10
        parent = parents[current] if regenerate and current is not None else current
        parents.append(parent)
        turns.append(
            node_memory.TurnIn(
                message_id=f"m{len(turns)}",
                parent_message_id=None if parent is None else f"m{parent}",
                user_content=sentence(rng, 8, 40),
                assistant_content=sentence(rng, 20, 120),
            )
        )
        current = len(turns) - 1
    node_memory.node_memory_append_turns(flow=flow, session_id=SESSION, node_id="llm1", turns=turns)


def timed(fn: Callable[[], Any], calls: int) -> tuple[list[float], Any]:
    result = None
    for _ in range(10):
        result = fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples, result


def report(name: str, samples: list[float], extra: str = "") -> None:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * len(ordered))) - 1)]
    mean = statistics.fmean(ordered)
    log(f"  {name:<46} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   mean {mean:7.2f} ms  {extra}")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()

    migrate_if_needed()
    log(
        f"machine: {os.cpu_count()} CPUs, {cpu_model()}; Python {platform.python_version()}; "
        f"database {settings.DATABASES['default']['NAME']}; "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average {os.getloadavg()[0]:.1f}"
    )
    user, _ = get_user_model().objects.get_or_create(username="bench-history")
    flow, _ = Flow.objects.get_or_create(owner=user, name="bench-history")
    existing = Message.objects.filter(flow=flow, session_id=SESSION).count()
    if args.fresh or existing != args.messages:
        Message.objects.filter(flow=flow).delete()
        log(f"building a {args.messages}-message conversation with branches ...")
        build_conversation(flow, args.messages)

    newest = conversation_history(flow=flow, session_id=SESSION, max_tokens=args.max_tokens)
    middle_id = (
        Message.objects.filter(flow=flow, session_id=SESSION, role="assistant")
        .order_by("created_at", "id")
        .values_list("id", flat=True)[args.messages // 4]
    )
    log(
        f"conversation: {args.messages} messages; thread of the newest within the "
        f"{settings.HISTORY_MESSAGE_LIMIT} candidates: {newest.thread_length} messages, "
        f"{len(newest.items)} kept in {newest.token_count} tokens (budget {args.max_tokens})"
    )
    samples, result = timed(
        lambda: conversation_history(flow=flow, session_id=SESSION, max_tokens=args.max_tokens),
        args.calls,
    )
    report("conversation history, newest", samples, f"{len(result.items)} messages")
    samples, result = timed(
        lambda: conversation_history(
            flow=flow,
            session_id=SESSION,
            current_message_id=middle_id,
            max_tokens=args.max_tokens,
        ),
        args.calls,
    )
    report("conversation history, current_message_id", samples, f"{len(result.items)} messages")

    with tempfile.TemporaryDirectory(prefix="bench-node-memory-") as tmp:
        storages = {
            **settings.STORAGES,
            "bench_node_memory": {
                "BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": tmp},
            },
        }
        for label, gzip_bytes in (("plain", 0), ("gzip", 64 * 1024)):
            with override_settings(
                STORAGES=storages,
                NODE_MEMORY_STORAGE="bench_node_memory",
                NODE_MEMORY_GZIP_BYTES=gzip_bytes,
            ):
                bench_node(flow, args, label, Path(tmp))


def bench_node(flow: Flow, args: argparse.Namespace, label: str, tmp: Path) -> None:
    for path in tmp.rglob("*.json*"):
        path.unlink()
    t0 = time.perf_counter()
    build_node_memory(flow, args.messages)
    build_ms = (time.perf_counter() - t0) * 1000
    (doc_path,) = tmp.rglob("llm1.json*")
    key = node_memory.node_key(flow=flow, session_id=SESSION, node_id="llm1")

    def history() -> Any:
        return node_memory.node_memory_history(
            flow=flow, session_id=SESSION, node_id="llm1", max_tokens=args.max_tokens
        )

    first = history()
    log(
        f"node memory ({label}): {doc_path.name} {doc_path.stat().st_size / 1e6:.2f} MB, "
        f"{args.messages} messages written in {build_ms:.0f} ms; thread of the newest "
        f"{first.thread_length} messages, {len(first.items)} kept in {first.token_count} tokens"
    )

    def cold() -> Any:
        node_documents._cache.clear()
        return history()

    samples, result = timed(cold, args.calls)
    report(f"node memory history ({label}), cold", samples, f"{len(result.items)} messages")

    def parse_cold() -> Any:
        node_documents._cache.clear()
        return node_documents._load(node_documents._storage(), key)

    samples, _ = timed(parse_cold, args.calls)
    report(f"  of which read + parse ({label})", samples)
    samples, result = timed(history, args.calls)
    report(f"node memory history ({label}), warm", samples, f"{len(result.items)} messages")
    appended = iter(range(10**6))

    def append() -> Any:
        return node_memory.node_memory_append_turn(
            flow=flow,
            session_id=SESSION,
            node_id="llm1",
            message_id=f"x{next(appended)}",
            user_content="One more question?",
            assistant_content="One more answer.",
        )

    samples, _ = timed(append, min(args.calls, 50))
    report(f"append one turn ({label})", samples)


if __name__ == "__main__":
    main()
