"""A scripted OpenAI-compatible model for the Open WebUI demo (no model download, no
network): ``GET /v1/models`` lists ``demo-model``; it answers the prompts the memory
service builds as a model would (recognised by ``prompt_kind``), and a chat with a short
canned answer quoting the memory block:

- the engine's extraction: the user's first-person sentences as facts, each naming the
  message it comes from ("[m1] user: I drink green tea every morning." -> "User drinks
  green tea every morning", sources ["m1"]); current facts are not repeated;
- a deep dream: every fact of MEMORY.md kept as it is;
- a context summary: the first words of each line folded;
- query rewriting: the question's words as one query, and without its question words.

``tests/scripts/test_demo_model.py`` renders each prompt from the code and checks the
answer is understood, so a prompt change that this model no longer follows fails there.

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
QUESTION_WORDS = {"what", "when", "where", "who", "why", "how", "which", "do", "does", "did",
                  "is", "are", "was", "i", "my", "the", "a"}  # fmt: skip
# How each prompt of the service starts or says what it wants (memories/engine, ingestion,
# knowledge/rewrite.py, memories/conversations/summaries.py).
MARKERS = (
    ("extraction", "You maintain the long-term memory"),
    ("dream", 'a "deep dream"'),
    ("summary", "Create a summary of the conversation below"),
    ("summary", "This is the summary of the conversation so far"),
    ("rewrite", "You help a search engine find passages"),
)


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


def prompt_kind(messages: list[dict[str, Any]]) -> str:
    text = "\n".join(str(m.get("content")) for m in messages)
    return next((kind for kind, marker in MARKERS if marker in text), "chat")


def extraction(prompt: str) -> dict[str, Any]:
    """Conversation lines are ``[<ref>] <role>: <text>``; current facts ``id | category |
    confidence | content``."""
    current = {line.rsplit(" | ", 1)[-1] for line in prompt.splitlines() if line.count(" | ") >= 3}
    facts = []
    for match in re.finditer(r"^\[([^\]]+)\] user: (.*)$", prompt, re.M):
        ref, text = match.groups()
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            fact = third_person(sentence)
            if fact and fact not in current:
                facts.append({"content": fact, "category": "context", "confidence": 0.9,
                              "replaces": None, "sources": [ref]})  # fmt: skip
    return {"newFacts": facts, "factsToRemove": []}


def dream(prompt: str) -> dict[str, Any]:
    """MEMORY.md lines are ``- [<confidence>] <content> (id: <id>)`` under ``## <category>``."""
    facts, category = [], "context"
    for line in prompt.splitlines():
        if line.startswith("## "):
            category = line[3:].strip()
        match = re.match(r"^- \[([0-9.]+)\] (.*) \(id: ([^)]+)\)$", line)
        if match:
            confidence, content, fact_id = match.groups()
            facts.append({"id": fact_id, "content": content, "category": category,
                          "confidence": float(confidence), "day": None})  # fmt: skip
    return {"facts": facts, "diary": f"Kept the {len(facts)} facts as they were."}


def summary(prompt: str) -> str:
    lines = re.findall(r"^(user|assistant|system|tool): (.*)$", prompt, re.M)
    return "Summary: " + "; ".join(f"{role}: {' '.join(text.split()[:6])}" for role, text in lines)


def rewrite(question: str) -> dict[str, Any]:
    words = re.findall(r"[\w'-]+", question)
    keywords = [w for w in words if w.casefold() not in QUESTION_WORDS]
    return {"queries": [" ".join(words), " ".join(keywords)]}


def answer(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    text = "\n".join(str(m.get("content")) for m in messages)
    kind = prompt_kind(messages)
    if kind == "extraction":
        return json.dumps(extraction(text))
    if kind == "dream":
        return json.dumps(dream(text))
    if kind == "summary":
        return summary(text)
    if kind == "rewrite":
        return json.dumps(rewrite(str(messages[-1].get("content"))))
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    remembered = [ln[2:] for ln in str(system).splitlines() if ln.startswith("- [")]
    last = str(messages[-1].get("content")) if messages else ""
    reply = f"(demo model) You said: {last}"
    if remembered:
        reply += " | I remember: " + "; ".join(remembered)
    return reply


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
