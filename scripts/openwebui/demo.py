"""Drive a running Open WebUI through its HTTP API, as a user would through the browser:
sign up, list models, open a chat, send a message, then show what the memory service
learned (the memory, the recorded conversation) and Open WebUI's view of /mcp.

    python scripts/openwebui/demo.py OWUI_URL SERVICE_URL API_KEY
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any


def call(method: str, url: str, body: Any = None, token: str | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{method} {url} -> {exc.code}: {exc.read().decode()[:500]}") from None
    return json.loads(text) if text.strip().startswith(("{", "[")) else text


def step(title: str, value: Any) -> None:
    print(f"\n== {title}")
    print(value if isinstance(value, str) else json.dumps(value, indent=2)[:2000])


def turn(owui: str, token: str, model: str, chat_id: str, text: str, *, parent: str | None,
         earlier: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """One chat turn as the browser sends it: the user message and the answer get ids,
    so Open WebUI stores them in the chat and forwards X-OpenWebUI-Chat-Id."""
    user_id, assistant_id = str(uuid.uuid4()), str(uuid.uuid4())
    answer = call("POST", f"{owui}/api/chat/completions", {
        "model": model, "chat_id": chat_id, "id": assistant_id, "parent_id": parent,
        "stream": False,
        "user_message": {"id": user_id, "parentId": parent, "childrenIds": [], "role": "user",
                         "content": text, "timestamp": int(time.time()), "models": [model]},
        "messages": [*(earlier or []), {"role": "user", "content": text}]}, token=token)  # fmt: skip
    return {**answer, "_assistant_id": assistant_id}


def main(owui: str, service: str, key: str) -> int:
    email = os.environ.get("DEMO_EMAIL", "alice@example.com")
    login = {"email": email, "password": "demo-password-1"}
    try:
        user = call("POST", f"{owui}/api/v1/auths/signup", {"name": "Alice", **login})
    except SystemExit:  # signed up by an earlier run against the same Open WebUI
        user = call("POST", f"{owui}/api/v1/auths/signin", login)
    token, user_id = user["token"], user["id"]
    step("Open WebUI user (the first one is admin)", {"id": user_id, "name": user["name"]})
    models = call("GET", f"{owui}/api/models", token=token)
    ids = [m["id"] for m in models["data"]]
    step("models Open WebUI lists (from the proxy's GET /v1/models)", ids)
    model = ids[0]
    message = "I drink green tea every morning."
    chat = call("POST", f"{owui}/api/v1/chats/new", {"chat": {
        "title": "demo", "models": [model], "messages": [],
        "history": {"messages": {}, "currentId": None}}}, token=token)  # fmt: skip
    step("chat created", {"chat_id": chat["id"]})
    answer = turn(owui, token, model, chat["id"], message, parent=None)
    step("answer through the proxy", answer["choices"][0]["message"]["content"])

    memories: list[Any] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not memories:
        found = call("GET", f"{service}/api/v1/users/{user_id}/memories", token=key)
        memories = found.get("results", found) if isinstance(found, dict) else found
        if not memories:
            time.sleep(2)
    step("memory formed for the Open WebUI user (GET /api/v1/users/<id>/memories)",
         [m["content"] for m in memories])  # fmt: skip

    flows = call("GET", f"{service}/api/v1/flows", token=key)
    flow = next(f for f in flows.get("results", flows) if f["name"] == "chat-proxy")
    history = call("GET", f"{service}/api/v1/conversations/{chat['id']}/history?flow={flow['id']}",
                   token=key)  # fmt: skip
    step("the chat recorded as a conversation (X-OpenWebUI-Chat-Id)",
         [(m["role"], m["content"]) for m in history["messages"]])  # fmt: skip

    second = turn(owui, token, model, chat["id"], "What do I drink in the morning?",
                  parent=answer["_assistant_id"], earlier=[
                      {"role": "user", "content": message},
                      {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}])  # fmt: skip
    step("next answer, with the memory injected", second["choices"][0]["message"]["content"])

    verify = call("POST", f"{owui}/api/v1/configs/tool_servers/verify", {
        "url": f"{service}/mcp", "path": "", "type": "mcp", "auth_type": "bearer", "key": key,
        "config": {"enable": True}, "info": {"id": "memory", "name": "memory"}}, token=token)  # fmt: skip
    tools = verify.get("specs") or verify.get("tools") or verify
    names = (
        sorted({t.get("name") for t in tools if isinstance(t, dict)})
        if isinstance(tools, list)
        else tools
    )
    step("Open WebUI's MCP client against /mcp (tool server verify)", names)
    return 0 if memories else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
