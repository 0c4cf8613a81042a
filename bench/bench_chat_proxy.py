"""Chat proxy overhead.

    EMBEDDED_DB_NAME=bench_chat EMBEDDING_PROVIDER=hashing .venv/bin/python bench/bench_chat_proxy.py

1. Overhead: p50/p99 of POST /v1/chat/completions through the full Django stack
   (authentication, validation, retrieval over the user's memories, injection,
   forwarding the request's bytes over HTTP to an OpenAI-compatible upstream on
   127.0.0.1) against the
   openai client calling the same upstream directly. Embedding the query is
   timed separately and subtracted: the figure is the service's own cost.

(What learning costs per message, the LLM calls of the debounced updates, is
``bench/bench_engine_updates.py``'s.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDING_PROVIDER", "hashing")
os.environ["CONN_MAX_AGE"] = "60"
# 900 requests a minute would trip the API key's chat throttle (CHAT_THROTTLE_RATE).
os.environ.setdefault("CHAT_THROTTLE_RATE", "1000000/minute")

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

import openai  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from core.providers import embeddings  # noqa: E402
from core.services import api_key_create  # noqa: E402
from memories.facts.scopes import end_user_ensure  # noqa: E402
from memories.facts.services import FactIn, fact_add  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer, Scripted, chat_body  # noqa: E402

TOPICS = [
    "hiking",
    "TypeScript",
    "green tea",
    "violin",
    "Berlin",
    "cycling",
    "jazz",
    "sushi",
    "Rust",
    "gardening",
    "chess",
    "photography",
    "Python",
    "running",
    "coffee",
    "Lisbon",
]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def overhead(server: FakeOpenAIServer, owner, requests: int) -> None:
    end_user = end_user_ensure(owner=owner, external_id="bench-user")
    if not end_user.links.exists():
        at = timezone.now() - timedelta(days=1)
        facts = [FactIn(f"User likes {TOPICS[i % len(TOPICS)]} (fact {i})", observed_at=at)
                 for i in range(200)]  # fmt: skip
        fact_add(owner=owner, scope=end_user, facts=facts, dedup_threshold=1.01, reason="bench")
    _, key = api_key_create(owner=owner, name="bench")
    server.default_chat = Scripted(
        body=chat_body("Sure, here is an answer of moderate length. " * 4)
    )
    body = {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {
                "role": "user",
                "content": "What should I do this weekend? I like TypeScript and hiking.",
            },
        ],
    }
    direct_client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    client = Client()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    # Formation would call the upstream again: anonymous requests for the overhead
    # of the answer path, identified ones for the path with retrieval.
    embedder = embeddings.get_embedder()
    text = body["messages"][-1]["content"]
    for _ in range(20):  # warm up both paths
        direct_client.chat.completions.create(**body)
        client.post("/v1/chat/completions", body, content_type="application/json", **headers)
    direct, anonymous, identified, embed = [], [], [], []
    for _ in range(requests):
        t = time.perf_counter()
        direct_client.chat.completions.create(**body)
        direct.append(time.perf_counter() - t)
        t = time.perf_counter()
        response = client.post(
            "/v1/chat/completions", body, content_type="application/json", **headers
        )
        anonymous.append(time.perf_counter() - t)
        assert response.status_code == 200, response.content
        t = time.perf_counter()
        embedder.embed([text])
        embed.append(time.perf_counter() - t)
        t = time.perf_counter()
        response = client.post(
            "/v1/chat/completions",
            {**body, "user": "bench-user"},
            content_type="application/json",
            **headers,
        )
        identified.append(time.perf_counter() - t)
        assert response.status_code == 200 and response.json()["memories"], response.content
    ms = 1000
    embed_p50 = statistics.median(embed) * ms
    print(f"requests per path: {requests}; user memories: {end_user.links.count()}")
    print(
        f"direct upstream (openai client)  p50 {statistics.median(direct) * ms:6.2f} ms  p99 {pct(direct, 0.99) * ms:6.2f} ms"
    )
    print(
        f"proxy, anonymous                 p50 {statistics.median(anonymous) * ms:6.2f} ms  p99 {pct(anonymous, 0.99) * ms:6.2f} ms"
    )
    print(
        f"proxy, with retrieval            p50 {statistics.median(identified) * ms:6.2f} ms  p99 {pct(identified, 0.99) * ms:6.2f} ms"
    )
    print(f"query embedding ({embedder.provider})       p50 {embed_p50:6.2f} ms")
    over_anon = [(a - d) * ms for a, d in zip(anonymous, direct)]
    over_ident = [(i - d - e) * ms for i, d, e in zip(identified, direct, embed)]
    print(
        f"overhead, anonymous (paired)     p50 {statistics.median(over_anon):6.2f} ms  p99 {pct(over_anon, 0.99):6.2f} ms"
    )
    print(
        f"overhead, retrieval excl. embed  p50 {statistics.median(over_ident):6.2f} ms  p99 {pct(over_ident, 0.99):6.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    server = FakeOpenAIServer().start()
    server.serve_as_llm(settings)
    # The hashing embedder scores paraphrases low; let retrieval inject memories.
    settings.MEMORY_SCORE_THRESHOLD = 0.1
    owner, _ = get_user_model().objects.get_or_create(username="bench-chat")
    print(f"machine: {os.cpu_count()} cores; embedder: {embeddings.get_embedder().provider}")
    print("== proxy overhead ==")
    overhead(server, owner, args.requests)
    server.stop()
    # The identified requests queued formation tasks that no worker ran here.
    from django_q.models import OrmQ

    OrmQ.objects.all().delete()


if __name__ == "__main__":
    main()
