"""The README's two-minute tour, run as written against `manage.py serve`.

The block after the ``<!-- tour: ... -->`` marker is executed by bash unchanged; only the
environment differs from a fresh machine: the served instance's port (``URL``, which the
tour reads with a default), its own database (``EMBEDDED_DB_NAME``) and the chat LLM,
the scripted fake on 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.core.test_serve import _serve, _stop, _wait_healthy, serve_env  # noqa: F401
from tests.fakes.openai_server import FakeOpenAIServer, Scripted, chat_body
from tests.readme import readme_block

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SAID = "I drink green tea every morning."
FACT = "User drinks green tea every morning"
ANSWER = "Noted: green tea every morning."


def _json_values(text: str) -> list:
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values


def _scripted_llm(payload: dict) -> Scripted:
    """The proxied chat gets an answer; the background extraction gets the fact."""
    if payload["messages"][-1].get("content") == SAID:
        return Scripted(body=chat_body(ANSWER))
    fact = {"content": FACT, "category": "preference", "confidence": 0.9}
    return Scripted(body=chat_body(json.dumps({"newFacts": [fact], "factsToRemove": []})))


def test_the_readme_tour_runs_as_written(serve_env):  # noqa: F811
    llm = FakeOpenAIServer()
    llm.chat_fn = _scripted_llm
    llm.start()
    base = f"http://127.0.0.1:{serve_env['PORT']}"
    env = {
        **serve_env,
        "LLM_BASE_URL": llm.base_url,
        "LLM_MODEL": "fake-model",
        "LLM_API_KEY": "sk-test",
        # Facts are learned once a user's messages pause (30 s by default): at once here.
        "MEMORY_UPDATE_DEBOUNCE_SECONDS": "0",
    }
    proc = _serve(env)
    try:
        _wait_healthy(base, proc)
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", readme_block("tour", "sh")],
            cwd=ROOT,
            env={**env, "URL": base},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 0, ran.stderr
        written, hits, chat, memories = _json_values(ran.stdout)
        assert (written["documents"], written["chunks_written"]) == (2, 2)
        assert [hit["text"] for hit in hits["results"]] == [
            "Support answers on weekdays from 9 to 5, Lisbon time."
        ]
        assert chat["choices"][0]["message"]["content"] == ANSWER
        assert chat["memories"] == []  # alice had none yet
        assert isinstance(memories["results"], list)
        # A moment later: what the worker learned from the chat.
        key = _new_key(env)
        deadline = time.monotonic() + 60
        learned: list[str] = []
        while time.monotonic() < deadline and FACT not in learned:
            learned = [m["content"] for m in _get(f"{base}/api/v1/users/alice/memories", key)]
            time.sleep(0.5)
        assert learned == [FACT]
    finally:
        _stop(proc)
        llm.stop()


def _new_key(env: dict[str, str]) -> str:
    """Another key for alice, made the way the tour makes one."""
    out = subprocess.run(
        [".venv/bin/python", "manage.py", "create_api_key", "alice", "--create-user"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def _get(url: str, key: str) -> list[dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=15) as response:
        return json.loads(response.read())["results"]
