"""A stand-in for Open WebUI 0.12.4: the part of its HTTP API that
``scripts/openwebui/demo.py`` drives, doing what Open WebUI does with it. Started by
``scripts/openwebui/run.sh`` in its place (``open-webui serve --host H --port P``),
with the environment run.sh gives Open WebUI: ``OPENAI_API_BASE_URL`` (the proxy) and
``OPENAI_API_KEY``.

- sign-up answers a user (a UUID, as Open WebUI's ids are) and a token;
- ``GET /api/models`` lists the proxy's ``GET /v1/models``;
- a new chat gets a UUID;
- ``POST /api/chat/completions`` is relayed to the proxy's ``/v1/chat/completions``
  with the headers ``ENABLE_FORWARD_USER_INFO_HEADERS`` adds (user id, name, email,
  and the chat id of a turn that names a saved chat);
- the tool server verify lists the MCP server's tools with the MCP SDK's client.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

BASE = os.environ["OPENAI_API_BASE_URL"].rstrip("/")
KEY = os.environ["OPENAI_API_KEY"]
USERS: dict[str, dict[str, str]] = {}  # token -> user


def upstream(
    method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> Any:
    request = urllib.request.Request(
        BASE + path, method=method, data=json.dumps(body).encode() if body is not None else None
    )
    request.add_header("Authorization", f"Bearer {KEY}")
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


async def mcp_tools(url: str, key: str) -> list[str]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return [tool.name for tool in (await session.list_tools()).tools]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _user(self) -> dict[str, str]:
        return USERS[self.headers.get("Authorization", "").removeprefix("Bearer ")]

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._json({"status": True})
        elif self.path == "/api/models":
            self._json({"data": upstream("GET", "/models")["data"]})
        else:
            self._json({"detail": "not found"}, 404)

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/api/v1/auths/signup":
            token, user = uuid.uuid4().hex, {"id": str(uuid.uuid4()), "name": body["name"],
                                             "email": body["email"]}  # fmt: skip
            USERS[token] = user
            self._json({**user, "token": token})
        elif self.path == "/api/v1/chats/new":
            self._json({"id": str(uuid.uuid4()), **body["chat"]})
        elif self.path == "/api/chat/completions":
            user = self._user()
            headers = {"X-OpenWebUI-User-Id": user["id"], "X-OpenWebUI-User-Name": user["name"],
                       "X-OpenWebUI-User-Email": user["email"]}  # fmt: skip
            if body.get("chat_id") and body.get("id"):
                headers["X-OpenWebUI-Chat-Id"] = body["chat_id"]
            asked = {"model": body["model"], "messages": body["messages"], "stream": False}
            self._json(upstream("POST", "/chat/completions", asked, headers))
        elif self.path == "/api/v1/configs/tool_servers/verify":
            names = asyncio.run(mcp_tools(body["url"], body["key"]))
            self._json({"specs": [{"name": name} for name in names]})
        else:
            self._json({"detail": "not found"}, 404)


if __name__ == "__main__":
    args = sys.argv[1:]
    host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
    ThreadingHTTPServer((host, port), Handler).serve_forever()
