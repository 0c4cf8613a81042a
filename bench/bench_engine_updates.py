"""Memory LLM calls per user message through the chat proxy, with and without the debounce.

    EMBEDDED_DB_NAME=bench_engine .venv/bin/python bench/bench_engine_updates.py

Users talk to the proxy (POST /v1/chat/completions through the full Django stack, the
upstream a scripted OpenAI-compatible server on 127.0.0.1) in bursts: 3 messages in a
row, a pause longer than the debounce window, 3 more. Every request queues the
user's message for memory formation (django-q2 in sync mode here, so the queued task
runs in the request). Counted: the LLM requests the upstream receives for memory
(not the chat answers), per user message, for

(The per-message formation this service ran before the engine, one extraction per
message then one conflict check per extracted fact with related memories, is gone;
its figure, 1.6-2.3 calls per message, is in BENCHMARKS.md.)

- MEMORY_UPDATE_DEBOUNCE_SECONDS=0: the engine queue with the debounce off (one
  extraction per message);
- MEMORY_UPDATE_DEBOUNCE_SECONDS=30: the debounced queue. The pause is simulated:
  after each burst the due scopes run with their clock 31 s ahead (what the per-scope
  schedule does 30 s later in production), instead of sleeping.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDING_PROVIDER", "hashing")

import django  # noqa: E402

django.setup()

from django_q.conf import Conf  # noqa: E402

Conf.SYNC = True  # queued tasks run in the request: every call is counted

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from core.services import api_key_create  # noqa: E402
from ingestion.updates import updates_run  # noqa: E402
from memories.engine.models import PendingUpdate  # noqa: E402
from memories.engine.updates import due_scopes  # noqa: E402
from memories.facts.models import Scope  # noqa: E402
from memories.facts.services import scope_erase  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer, Scripted, chat_body  # noqa: E402

BURSTS = [
    ["I just moved to Lisbon.", "I'm learning Portuguese there.", "Can you suggest a course?"],
    ["I switched my side project to Rust.", "I run 10 km every Sunday.", "Thanks, that's all!"],
]
FACTS = {
    "I just moved to Lisbon.": "User lives in Lisbon",
    "I'm learning Portuguese there.": "User is learning Portuguese",
    "I switched my side project to Rust.": "User uses Rust for a side project",
    "I run 10 km every Sunday.": "User runs 10 km every Sunday",
}


def upstream(server: FakeOpenAIServer) -> None:
    def respond(payload: dict) -> Scripted:
        content = " ".join(str(m.get("content")) for m in payload["messages"])
        if "You maintain the long-term memory" in content:  # the engine's extraction
            found = [{"content": f, "category": "context", "confidence": 0.9}
                     for m, f in FACTS.items() if f"user: {m}" in content]  # fmt: skip
            return Scripted(body=chat_body(json.dumps({"newFacts": found, "factsToRemove": []})))
        return Scripted(body=chat_body("Sure."))

    server.chat_fn = respond


def memory_calls(server: FakeOpenAIServer, since: int) -> int:
    marker = "You maintain the long-term memory"
    return sum(marker in str(r["json"]) for r in server.requests[since:])


def reset(owner, users: int) -> None:
    for end_user in Scope.objects.filter(owner=owner):
        scope_erase(scope=end_user)
    PendingUpdate.objects.filter(owner=owner).delete()


def through_proxy(server, owner, key: str, users: int, debounce: float) -> tuple[int, int, float]:
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = debounce
    client, headers = Client(), {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    since, messages = len(server.requests), 0
    t = time.perf_counter()
    for burst in BURSTS:
        for user in range(users):
            for text in burst:
                body = {"model": "fake-model", "user": f"u{user}",
                        "messages": [{"role": "user", "content": text}]}  # fmt: skip
                response = client.post("/v1/chat/completions", body,
                                       content_type="application/json", **headers)  # fmt: skip
                assert response.status_code == 200, response.content
                messages += 1
        # the window closes: what the scope's schedule (or the sweep) runs 30 s later
        clock = timezone.now() + timedelta(seconds=debounce + 1)
        for scope_id in due_scopes(now=clock):
            updates_run(scope_id=scope_id, now=clock)
    elapsed = time.perf_counter() - t
    assert not PendingUpdate.objects.filter(owner=owner, status="pending").exists()
    return memory_calls(server, since), messages, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    logging.getLogger("memories.decisions").setLevel(logging.WARNING)
    server = FakeOpenAIServer().start()
    upstream(server)
    server.serve_as_llm(settings)
    owner, _ = get_user_model().objects.get_or_create(username="bench-engine")
    _, key = api_key_create(owner=owner, name="bench")
    print(f"machine: {os.cpu_count()} cores; users: {args.users}; bursts of "
          f"{len(BURSTS[0])} messages: {len(BURSTS)} per user")  # fmt: skip
    for debounce in (0.0, 30.0):
        reset(owner, args.users)
        calls, n, _ = through_proxy(server, owner, key, args.users, debounce)
        print(f"proxy, MEMORY_UPDATE_DEBOUNCE_SECONDS={debounce:>4.0f}  {calls / n:.2f} memory LLM calls "
              f"per user message ({calls}/{n})")  # fmt: skip
    reset(owner, args.users)
    server.stop()


if __name__ == "__main__":
    main()
