"""An OpenAI-compatible HTTP server on 127.0.0.1 with scripted answers.

Tests push responses onto a queue; each request pops one (or falls back to a
default). Requests are recorded so tests can assert what was sent. The real
``openai`` client talks to it over HTTP, so the client path runs for real.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Scripted:
    status: int = 200
    body: Any = None  # dict -> JSON; str or bytes -> sent as they are
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    # SSE when set: a dict is one event ``data: <json>``; bytes go out as they are
    stream_chunks: list[dict[str, Any] | bytes] | None = None
    compact: bool = False  # JSON without spaces, non-ASCII as raw UTF-8 (as many servers)
    split: int = 0  # write each event in pieces of this many bytes (separate TCP reads)
    done: bool = True  # end the stream with ``data: [DONE]``

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        if self.compact:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        return json.dumps(value).encode()

    def event(self, chunk: dict[str, Any] | bytes) -> bytes:
        return chunk if isinstance(chunk, bytes) else b"data: " + self.encode(chunk) + b"\n\n"


def chat_body(content: str, *, model: str = "fake-model", usage: dict | None = None) -> dict:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def chat_chunks(pieces: list[str], *, model: str = "fake-model") -> list[dict[str, Any]]:
    chunks = []
    for i, piece in enumerate(pieces):
        delta = {"content": piece} if i else {"role": "assistant", "content": piece}
        chunks.append(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
        )
    chunks.append(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    return chunks


def embedding_body(vectors: list[list[float]], *, model: str = "fake-embed") -> dict:
    return {
        "object": "list",
        "model": model,
        "data": [
            {"object": "embedding", "index": i, "embedding": vector}
            for i, vector in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
    }


class FakeOpenAIServer:
    def __init__(self) -> None:
        self.queue: deque[Scripted] = deque()
        self.requests: list[dict[str, Any]] = []
        self.default_chat: Scripted | None = None
        self.embed_fn = None  # callable(list[str]) -> list[list[float]] for embeddings
        self.chat_fn = None  # callable(request json) -> Scripted, when the queue is empty
        self.models: dict[str, Any] | None = None  # GET /models answers it (None: 404)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without TCP_NODELAY the second
            # waits ~40 ms for a delayed ACK and every call looks slow.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                with server._lock:
                    server.requests.append(
                        {
                            "path": self.path,
                            "method": "GET",
                            "json": None,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                        }
                    )
                if self.path.endswith("/models") and server.models is not None:
                    self._answer(Scripted(body=server.models))
                else:
                    self._answer(Scripted(status=404, body={"error": {"message": "not found"}}))

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    payload = json.loads(raw or b"{}")
                except ValueError:
                    payload = {"_raw": raw.decode(errors="replace")}
                with server._lock:
                    server.requests.append(
                        {
                            "path": self.path,
                            "json": payload,
                            "raw": raw,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                        }
                    )
                    scripted = server.queue.popleft() if server.queue else None
                if scripted is None:
                    scripted = server._default_for(self.path, payload)
                if scripted.delay:
                    time.sleep(scripted.delay)
                try:
                    self._answer(scripted)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _answer(self, scripted: Scripted) -> None:
                if scripted.stream_chunks is not None:
                    self.send_response(scripted.status)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    events = [scripted.event(c) for c in scripted.stream_chunks]
                    for event in [*events, b"data: [DONE]\n\n"][: None if scripted.done else -1]:
                        size = scripted.split or len(event)
                        for at in range(0, len(event), size):
                            self.wfile.write(event[at : at + size])
                            self.wfile.flush()
                            if scripted.split:
                                time.sleep(0.002)  # so the pieces arrive as separate reads
                    self.close_connection = True
                    return
                data = scripted.encode(scripted.body)
                self.send_response(scripted.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in scripted.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # shutdown() waits for the loop's next look (0.5 s by default): a test's teardown
        # paid it, 300 times a run.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def _default_for(self, path: str, payload: dict[str, Any]) -> Scripted:
        if path.endswith("/embeddings") and self.embed_fn is not None:
            inputs = payload.get("input")
            texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
            return Scripted(body=embedding_body(self.embed_fn(texts)))
        if path.endswith("/chat/completions") and self.chat_fn is not None:
            return self.chat_fn(payload)
        if self.default_chat is not None:
            return self.default_chat
        return Scripted(status=500, body={"error": {"message": "no scripted response"}})

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def serve_as_llm(self, settings: Any, model: str = "fake-model") -> None:
        """Point the chat LLM of ``settings`` (Django's, or pytest-django's fixture) here."""
        for name, value in self.llm_env(model).items():
            setattr(settings, name, value)

    def llm_env(self, model: str = "fake-model") -> dict[str, str]:
        """The chat LLM's variables pointing here, for a served instance's environment."""
        return {"LLM_BASE_URL": self.base_url, "LLM_MODEL": model, "LLM_API_KEY": "x"}

    def push(self, *responses: Scripted) -> None:
        with self._lock:
            self.queue.extend(responses)

    def start(self) -> FakeOpenAIServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
