"""A scripted OpenAI-compatible model for the Open WebUI demo (no model download, no
network): ``GET /v1/models`` lists ``demo-model``; a chat gets a short canned answer; the
memory engine's extraction prompt gets the user's first-person sentences back as facts
("I drink green tea every morning." -> "User drinks green tea every morning").

    python scripts/openwebui/demo_llm.py 8771
"""

from __future__ import annotations

import json
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

IRREGULAR = {"am": "is", "have": "has", "do": "does", "go": "goes", "'m": "is"}


def third_person(sentence: str) -> str | None:
    match = re.match(r"^I\s+(\S+)\s+(.*?)[.!]?$", sentence.strip())
    if match is None:
        return None
    verb, rest = match.groups()
    if verb in IRREGULAR:
        verb = IRREGULAR[verb]
    elif verb.endswith(("s", "sh", "ch", "x", "o")):
        verb += "es"
    else:
        verb += "s"
    return f"User {verb} {rest}"


def extraction(prompt: str) -> dict[str, Any]:
    facts = []
    for line in prompt.splitlines():
        said = re.match(r"^(?:\[[^\]]*\] )?user: (.*)$", line)  # "[<message ref>] user: ..."
        if said:
            for sentence in re.split(r"(?<=[.!?])\s+", said.group(1)):
                fact = third_person(sentence)
                if fact:
                    facts.append({"content": fact, "category": "context", "confidence": 0.9})
    return {"newFacts": facts, "factsToRemove": []}


def completion(content: str, model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-demo-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }  # fmt: skip


def answer(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    text = " ".join(str(m.get("content")) for m in messages)
    if "You maintain the long-term memory" in text:
        return json.dumps(extraction(text))
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    remembered = [ln[2:] for ln in str(system).splitlines() if ln.startswith("- [")]
    last = str(messages[-1].get("content")) if messages else ""
    reply = f"(demo model) You said: {last}"
    if remembered:
        reply += " | I remember: " + "; ".join(remembered)
    return reply


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [
                {"id": "demo-model", "object": "model", "created": 0, "owned_by": "demo"}]})  # fmt: skip
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        model = body.get("model") or "demo-model"
        content = answer(body)
        if not body.get("stream"):
            self._json(200, completion(content, model))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        base = {"id": "chatcmpl-demo", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model}  # fmt: skip
        for i, word in enumerate(content.split(" ")):
            delta = {"content": (" " if i else "") + word}
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        end = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        self.close_connection = True


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
