"""A scripted LLM for the engine's background work (served by tests/fakes/openai_server.py).

Extraction prompts answer the facts listed for the user message(s) they contain;
dream prompts answer what ``dream`` returns for the prompt; summary prompts answer a
summary naming what they folded. Calls are counted by kind.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from core.db import advisory_session_lock
from tests.fakes.openai_server import Scripted, chat_body


class EngineLLM:
    def __init__(
        self,
        extractions: dict[str, list[dict[str, Any]]] | None = None,
        dream: Callable[[str], dict[str, Any] | str] | None = None,
    ):
        self.extractions = extractions or {}
        self.dream = dream
        self.calls: dict[str, int] = {"extraction": 0, "dream": 0, "summary": 0, "chat": 0}
        self.prompts: dict[str, list[str]] = {k: [] for k in self.calls}

    def __call__(self, payload: dict[str, Any]) -> Scripted:
        content = "\n".join(str(m.get("content")) for m in payload.get("messages", []))
        if "You maintain the long-term memory" in content:
            return self._answer("extraction", content, self._extract(content))
        if "deep dream" in content:
            answer = self.dream(content) if self.dream else {"facts": [], "diary": ""}
            return self._answer("dream", content, answer)
        if "summary" in content.lower() and "conversation" in content.lower():
            folded = re.findall(r"^((?:user|assistant|system|tool): .*)$", content, re.M)
            short = [" ".join(line.split()[:4]) for line in folded]
            return self._answer("summary", content, "SUMMARY[" + " | ".join(short) + "]")
        return self._answer("chat", content, "ok")

    def _extract(self, content: str) -> dict[str, Any]:
        facts = [
            fact
            for message, listed in self.extractions.items()
            if f"user: {message}" in content
            for fact in listed
        ]
        return {"newFacts": facts, "factsToRemove": []}

    def _answer(self, kind: str, prompt: str, answer: Any) -> Scripted:
        self.calls[kind] += 1
        self.prompts[kind].append(prompt)
        text = answer if isinstance(answer, str) else json.dumps(answer)
        return Scripted(body=chat_body(text))


def fact(content: str, category: str = "preference", confidence: float = 0.9, **extra: Any):
    return {"content": content, "category": category, "confidence": confidence, **extra}


@pytest.fixture
def engine_storage(tmp_path, settings):
    """Journals, MEMORY.md and diaries in a temporary directory."""
    location = tmp_path / "engine"
    settings.STORAGES = {**settings.STORAGES, "engine_test": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(location)},
    }}  # fmt: skip
    settings.ENGINE_STORAGE = "engine_test"
    return location


@contextmanager
def scope_held(scope_id: int) -> Iterator[None]:
    """Another worker holding the scope's run lock meanwhile (a thread, so a
    connection of its own)."""
    held, release = threading.Event(), threading.Event()

    def other_worker() -> None:
        with advisory_session_lock(f"engine-scope:{scope_id}") as taken:
            assert taken
            held.set()
            release.wait(30)
        connection.close()

    thread = threading.Thread(target=other_worker)
    thread.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        thread.join()
