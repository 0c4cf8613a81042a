"""What traces cost: the search path and the chat proxy with tracing on and off.

    EMBEDDED_DB_NAME=bench_tracing .venv/bin/python bench/bench_tracing.py [--rounds 20] [--ratio 0.1] [--breakdown]

Tracing on is the configuration an operator would run: every span sampled (``--ratio``:
a share of the traces), the SDK's
batch span processor, the OTLP/HTTP exporter sending to a local receiver this bench
starts as its own process (it answers each export 200, as a collector does, and counts
what it got). Off is the default (no OTEL_* variable set: no SDK object exists).

Both paths go through the whole Django stack in process (Django's test client: the
middleware, authentication, validation, the view): ``POST
/api/v1/knowledge-bases/{id}/search`` (hybrid, top 10, over ``--chunks`` chunks of one
base, the hashing embedder so that the embedding does not hide the cost; a query of
words a fifth of the base holds, and one of rare words) and ``POST
/v1/chat/completions`` with an end user of 200 facts (retrieval and injection) against
an OpenAI-compatible upstream on 127.0.0.1. On and off alternate in rounds of
``--requests`` requests (a new connection at each switch, its first requests not timed),
so drift of this shared machine falls on both alike: the figure is the median of the
rounds' p50 ratios, with the p50s of all requests of each side.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_tracing")
os.environ["EMBEDDING_PROVIDER"] = "hashing"
os.environ["CONN_MAX_AGE"] = "600"
os.environ.setdefault("CHAT_THROTTLE_RATE", "1000000/minute")
os.environ.setdefault("API_THROTTLE_RATE", "1000000/minute")
for name in [n for n in os.environ if n.startswith("OTEL_")]:
    del os.environ[name]  # off unless this bench turns it on

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from core import tracing  # noqa: E402
from core.services import api_key_create  # noqa: E402
from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.services.bases import knowledge_base_create  # noqa: E402
from knowledge.services.errors import DocumentIn  # noqa: E402
from knowledge.services.indexing import knowledge_index_pending  # noqa: E402
from knowledge.services.ingest import knowledge_base_ingest  # noqa: E402
from memories.facts.scopes import end_user_ensure  # noqa: E402
from memories.facts.services import FactIn, fact_add  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer, Scripted, chat_body  # noqa: E402

WORDS = ("rate limit invoice deploy cluster backup token budget search index replica "
         "session memory tenant vector keyword schema migration worker queue trace").split()  # fmt: skip
RECEIVER = textwrap.dedent("""
    import http.server, sys
    got = {"exports": 0, "bytes": 0}
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got["exports"] += 1; got["bytes"] += len(body)
            self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0"); self.end_headers()
        def do_GET(self):
            text = f'{got["exports"]} {got["bytes"]}'.encode()
            self.send_response(200); self.send_header("Content-Length", str(len(text)))
            self.end_headers(); self.wfile.write(text)
        def log_message(self, *args): pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
""")


def receiver() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, f"http://127.0.0.1:{process.stdout.readline().strip()}"


def received(url: str) -> tuple[int, int]:
    with urllib.request.urlopen(url + "/stats", timeout=10) as answer:
        exports, size = answer.read().decode().split()
    return int(exports), int(size)


def base_of(owner, chunks: int) -> KnowledgeBase:
    base = KnowledgeBase.objects.filter(owner=owner, name="tracing").first()
    if base is not None and base.chunks.count() == chunks:
        return base
    if base is not None:
        base.delete()
    base = knowledge_base_create(owner=owner, name="tracing")
    # 12 words a document: one of WORDS and 11 of 4,000 made-up ones, drawn by a Zipf law
    # (a few common, most rare), so a query word matches a realistic share of the base.
    rng = random.Random(7)
    c, v = "bcdfgklmnprstvz", "aeiou"
    vocabulary = [w + x + y + z for w in c for x in v for y in c for z in v][:4000]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    documents = [
        DocumentIn(
            text=" ".join([WORDS[i % len(WORDS)], *rng.choices(vocabulary, weights, k=11)]) + ".",
            source_key=f"doc-{i}",
        )
        for i in range(chunks)
    ]
    for start in range(0, chunks, 1000):
        knowledge_base_ingest(knowledge_base=base, documents=documents[start : start + 1000])
    return base


def facts_of(owner) -> None:
    end_user = end_user_ensure(owner=owner, external_id="bench-user")
    if not end_user.links.exists():
        at = timezone.now() - timedelta(days=1)
        facts = [FactIn(f"User likes {WORDS[i % len(WORDS)]} (fact {i})", observed_at=at)
                 for i in range(200)]  # fmt: skip
        fact_add(owner=owner, scope=end_user, facts=facts, dedup_threshold=1.01, reason="bench")


class Discard:
    """An exporter that drops what it is given (spans made, never encoded or sent)."""

    def export(self, spans: object) -> object:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def switch(on: bool | str, endpoint: str) -> Client:
    """Tracing on (OTLP to ``endpoint``), off, or (``"made"``) with every span made and
    dropped at once, from a new connection and client."""
    if tracing.active():
        tracing.tracing_stop()
    connection.close()
    if on == "made":
        tracing.tracing_start(Discard(), batch=False)
    elif on:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tracing.tracing_start(OTLPSpanExporter(endpoint=endpoint + "/v1/traces"))
    return Client()


def breakdown(path: str, body: dict, headers: dict, rounds: int, n: int, endpoint: str) -> None:
    """Where the cost goes: off, spans made and dropped, spans exported; p50 per round."""
    sides: dict[str, list[float]] = {"off": [], "spans made, dropped": [], "exported (OTLP)": []}
    for _ in range(rounds):
        for name, on in zip(sides, (False, "made", True)):
            sides[name].append(
                statistics.median(timed(switch(on, endpoint), path, body, headers, n))
            )
    switch(False, endpoint)
    for name, p50s in sides.items():
        print(f"  {name:20s} median of the rounds' p50 {statistics.median(p50s):6.2f} ms")


def timed(
    client: Client, path: str, body: dict, headers: dict, n: int, warm: int = 5
) -> list[float]:
    out = []
    for i in range(n + warm):
        started = time.perf_counter()
        response = client.post(path, body, content_type="application/json", **headers)
        elapsed = time.perf_counter() - started
        assert response.status_code == 200, response.content[:300]
        if i >= warm:
            out.append(elapsed * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="only the rare-word search: off, spans made and dropped, exported",
    )
    parser.add_argument("--ratio", type=float, default=None,
                        help="sample this share of the traces (the SDK's "
                             "parentbased_traceidratio sampler); default: every span")  # fmt: skip
    args = parser.parse_args()
    if args.ratio is not None:  # (read by the SDK when tracing starts)
        os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(args.ratio)
    call_command("migrate", verbosity=0)
    upstream = FakeOpenAIServer().start()
    upstream.default_chat = Scripted(body=chat_body("Sure, here is an answer. " * 4))
    upstream.serve_as_llm(settings)
    settings.MEMORY_SCORE_THRESHOLD = 0.1
    owner, _ = get_user_model().objects.get_or_create(username="bench-tracing")
    base = base_of(owner, args.chunks)
    while not knowledge_index_pending(max_seconds=3600).finished:  # (what the worker does)
        pass
    facts_of(owner)
    _, key = api_key_create(owner=owner, name="bench")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    process, endpoint = receiver()
    search = f"/api/v1/knowledge-bases/{base.pk}/search"
    paths = {
        "search, common words": (search, {"query": "replica lag and the session token budget",
                                          "top_k": 10}, headers),
        "search, rare words": (search, {"query": "kera loka naba pagi", "top_k": 10}, headers),
        "chat proxy": ("/v1/chat/completions",
                       {"model": "fake-model", "user": "bench-user",
                        "messages": [{"role": "user", "content": "Which worker queue and trace?"}]},
                       headers),
    }  # fmt: skip
    print(f"machine: {os.cpu_count()} cores; {args.chunks} chunks; {args.rounds} rounds of "
          f"{args.requests} requests per side and path; sampled: {args.ratio or 'every span'}")  # fmt: skip
    try:
        if args.breakdown:
            print("search, rare words:")
            breakdown(*paths["search, rare words"], args.rounds, args.requests, endpoint)
            return
        for name, (path, body, hdrs) in paths.items():
            ratios, on_all, off_all = [], [], []
            for r in range(args.rounds):
                order = (True, False) if r % 2 == 0 else (False, True)
                p50 = {}
                for on in order:
                    client = switch(on, endpoint)
                    times = timed(client, path, body, hdrs, args.requests)
                    (on_all if on else off_all).extend(times)
                    p50[on] = statistics.median(times)
                ratios.append(p50[True] / p50[False])
            switch(False, endpoint)
            print(f"{name:21s}  off p50 {statistics.median(off_all):6.2f} ms  "
                  f"on p50 {statistics.median(on_all):6.2f} ms  "
                  f"on/off (median of {args.rounds} rounds' p50 ratios) {statistics.median(ratios):.3f}  "
                  f"[rounds {min(ratios):.3f}-{max(ratios):.3f}]")  # fmt: skip
        exports, size = received(endpoint)
        print(f"receiver: {exports} exports, {size / 1e6:.1f} MB of spans")
    finally:
        process.terminate()
        upstream.stop()
        from django_q.models import OrmQ

        OrmQ.objects.all().delete()  # formation tasks of the chats; no worker runs here


if __name__ == "__main__":
    main()
