"""What each door costs for the same tool call: ``search_memory`` over a scope of N facts,
in process (``tool_call``), over OpenAI function calling (``POST /api/v1/tools/
search_memory/call``) and over MCP (one SDK client session to ``/mcp``), both HTTP doors
against the same real web server (``manage.py serve --no-worker``: gunicorn, 2 workers).

    EMBEDDED_DB_NAME=bench_tools .venv/bin/python bench/bench_tools.py --facts 200 --calls 200

Prints median and p90 per call, and each door's median over the in-process one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDING_PROVIDER", "hashing")

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

import httpx  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from core.services import api_key_create  # noqa: E402
from memories.facts.scopes import scope_find  # noqa: E402
from memories.facts.selectors import fact_count  # noqa: E402
from memories.facts.services import FactIn, fact_add  # noqa: E402
from memories.tools.registry import tool_call  # noqa: E402

SCOPE = ["user", "bench"]
ARGS = {"query": "which tea does the user drink in the morning", "limit": 5}


def _figures(name: str, seconds: list[float], base: float | None) -> float:
    ms = sorted(s * 1000 for s in seconds)
    median = statistics.median(ms)
    p90 = ms[int(len(ms) * 0.9) - 1]
    ratio = f"  x{median / base:.1f}" if base else ""
    print(f"{name:<22} median {median:7.2f} ms   p90 {p90:7.2f} ms{ratio}")
    return median


def _timed(call: Callable[[], object], n: int) -> list[float]:
    call()  # warm
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def _seed(owner: object, facts: int) -> None:
    row = scope_find(owner=owner, scope=tuple(SCOPE))  # type: ignore[arg-type]
    if row is not None and fact_count(scope=row) >= facts:
        return
    topics = ["green tea", "black coffee", "jazz", "Lisbon", "violin", "dark mode", "Rust"]
    batch = [
        FactIn(f"User note {i}: likes {topics[i % len(topics)]} ({i})", category="context")
        for i in range(facts)
    ]
    fact_add(owner=owner, scope=tuple(SCOPE), facts=batch, reason="bench")  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--facts", type=int, default=200)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--port", type=int, default=8790)
    options = parser.parse_args()

    call_command("migrate", verbosity=0)
    owner, _ = get_user_model().objects.get_or_create(username="bench-tools")
    _seed(owner, options.facts)
    key = api_key_create(owner=owner)[1]

    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--no-worker", "--port", str(options.port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{options.port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        print(f"search_memory over {options.facts} facts, {options.calls} calls per door")
        base = _figures(
            "in process",
            _timed(
                lambda: tool_call(owner=owner, name="search_memory", arguments=ARGS, scope=SCOPE),
                options.calls,
            ),  # fmt: skip
            None,
        )
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as api:
            body = {"scope": SCOPE, "arguments": ARGS}
            _figures(
                "function calling HTTP",
                _timed(
                    lambda: api.post(
                        "/api/v1/tools/search_memory/call", json=body
                    ).raise_for_status(),
                    options.calls,
                ),  # fmt: skip
                base,
            )
        _figures("MCP over HTTP", asyncio.run(_mcp(url, key, options.calls)), base)
    finally:
        server.terminate()
        server.wait(timeout=60)


async def _mcp(url: str, key: str, n: int) -> list[float]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    out = []
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url + "/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool("search_memory", {"scope": SCOPE, **ARGS})  # warm
                for _ in range(n):
                    start = time.perf_counter()
                    result = await session.call_tool("search_memory", {"scope": SCOPE, **ARGS})
                    out.append(time.perf_counter() - start)
                    assert not result.is_error, result.content
    return out


if __name__ == "__main__":
    main()
