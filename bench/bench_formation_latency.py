"""From a chat to a learned fact, through a real served instance and its real worker.

    .venv/bin/python bench/bench_formation_latency.py --chats 20

One ``manage.py serve`` (gunicorn and the supervised django-q2 cluster) on its own data
directory and embedded PostgreSQL (``scripts/faults/harness.py``), its model the demo
model (``scripts/openwebui/demo_llm.py``: it answers the engine's extraction at once) on
127.0.0.1, ``MEMORY_UPDATE_DEBOUNCE_SECONDS=2``. Each chat is one user message through
the chat proxy (``POST /v1/chat/completions``, a new end user each time); the figure is
the time from sending it to the first poll (every 50 ms) of
``GET /api/v1/users/{id}/memories`` that lists the fact. The 2 s window is part of it:
what is left above 2 s is the wait for the run to start and the run itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.faults.harness import Instance, free_port  # noqa: E402

SAID = "I drink green tea every morning."
FACT = "User drinks green tea every morning"


def _learned(inst: Instance, user: str) -> bool:
    reply = inst.get(f"/api/v1/users/{user}/memories")
    return reply.status == 200 and any(
        m.get("content") == FACT for m in reply.body.get("results", [])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=20)
    parser.add_argument("--debounce", type=float, default=2.0)
    args = parser.parse_args()

    port = free_port()
    model = subprocess.Popen([sys.executable, str(ROOT / "scripts/openwebui/demo_llm.py"),
                              str(port)])  # fmt: skip
    inst = Instance(env_overrides={
        "LLM_BASE_URL": f"http://127.0.0.1:{port}/v1", "LLM_MODEL": "demo-model",
        "MEMORY_UPDATE_DEBOUNCE_SECONDS": str(args.debounce),
    })  # fmt: skip
    seconds: list[float] = []
    try:
        inst.start()
        inst.wait_healthy()
        for n in range(args.chats):
            user = f"latency-{n}"
            started = time.monotonic()
            body = json.dumps({"messages": [{"role": "user", "content": SAID}]}).encode()
            reply = inst.raw("POST", "/v1/chat/completions", body,
                             {"Content-Type": "application/json", "X-OpenWebUI-User-Id": user})  # fmt: skip
            assert reply.status == 200, reply.body
            while not _learned(inst, user):
                if time.monotonic() - started > 120:
                    raise RuntimeError(f"{user}: nothing learned in 120 s\n{inst.log()[-3000:]}")
                time.sleep(0.05)
            seconds.append(time.monotonic() - started)
            print(f"chat {n + 1:>3}: learned after {seconds[-1]:.2f} s", flush=True)
    finally:
        inst.destroy()
        model.terminate()
        model.wait(10)
    ordered = sorted(seconds)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    print(f"\nchat -> learned fact, {len(seconds)} chats, debounce {args.debounce:g} s: "
          f"p50 {statistics.median(seconds):.2f} s, p95 {p95:.2f} s, "
          f"min {ordered[0]:.2f} s, max {ordered[-1]:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
