"""The MCP server over stdin/stdout (``manage.py mcp``), answering every request.

Why: the SDK's stdio transport reads a line that is not a JSON-RPC message (not JSON, a
batch, ``"jsonrpc": "1.0"``) and drops it without an answer, takes a request whose id is
null or an object for a notification (no answer ever comes), and ends the server at the
end of stdin with the requests still running cancelled: a client that sends a request
and closes its end (``printf ... | manage.py mcp``) gets nothing. Each of these left the
client waiting for its own timeout.

What: stdin goes through ``RefusingLines`` first. A line that ``jsonrpc_refusal`` (the
HTTP door's check) refuses is answered with its JSON-RPC error (-32700 or -32600, the
request's id when it had a usable one) through the server's own writer, and not passed
on. At the end of stdin the lines end only once every request passed on has been
answered (``ANSWER_WAIT_SECONDS`` at most). The SDK's claim of stdout (stray output of
a handler goes to stderr, not into the protocol) is kept.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from io import TextIOWrapper
from typing import Any, cast

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import ErrorData, JSONRPCError, JSONRPCResponse

from memories.tools.mcp_http import jsonrpc_refusal

ANSWER_WAIT_SECONDS = 120.0  # at the end of stdin, how long running requests may finish


class _InFlight:
    """The ids of the requests passed to the server and not answered yet."""

    def __init__(self) -> None:
        self.ids: set[Any] = set()
        self.changed = anyio.Event()

    def add(self, request_id: Any) -> None:
        self.ids.add(request_id)

    def answered(self, request_id: Any) -> None:
        self.ids.discard(request_id)
        self.changed.set()
        self.changed = anyio.Event()

    async def drained(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.ids and time.monotonic() < deadline:
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await self.changed.wait()


class RefusingLines:
    """stdin's lines, less those that are no JSON-RPC message MCP takes: each of those
    goes to ``refused`` as ``(id, code, message)``. Ends after the last line once every
    request passed on was answered."""

    def __init__(self, lines: Any, refused: Any, in_flight: _InFlight) -> None:
        self.lines, self.refused, self.in_flight = lines, refused, in_flight

    def __aiter__(self) -> AsyncIterator[str]:
        return self._read()

    async def _read(self) -> AsyncIterator[str]:
        import json

        async for line in self.lines:
            if not line.strip():
                continue
            refusal = jsonrpc_refusal(line.encode("utf-8", "replace"), "the line")
            if refusal is not None:
                await self.refused.send(refusal)
                continue
            message = json.loads(line)
            if "method" in message and "id" in message:  # a request: an answer is due
                self.in_flight.add(message["id"])
            yield line
        await self.in_flight.drained(ANSWER_WAIT_SECONDS)


class _Answers:
    """The server's send stream, noting each answer (a response or an error to a
    request) as it goes out."""

    def __init__(self, inner: Any, in_flight: _InFlight) -> None:
        self.inner, self.in_flight = inner, in_flight

    async def send(self, item: SessionMessage) -> None:
        await self.inner.send(item)
        if isinstance(item.message, JSONRPCResponse | JSONRPCError):
            self.in_flight.answered(item.message.id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __aenter__(self) -> _Answers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.aclose()


async def _answer_refusals(refused: Any, write_stream: Any) -> None:
    async for request_id, code, message in refused:
        error = JSONRPCError(
            jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message)
        )
        await write_stream.send(SessionMessage(error))


async def serve_stdio(server: MCPServer) -> None:
    """Run ``server`` on this process's stdin and stdout (module doc)."""
    refused_in, refused_out = anyio.create_memory_object_stream[tuple[Any, int, str]](64)
    in_flight = _InFlight()
    raw = os.fdopen(os.dup(0), "rb")  # (its own descriptor: closing it leaves fd 0 alone)
    lines = anyio.wrap_file(TextIOWrapper(raw, encoding="utf-8", errors="replace"))
    stdin = RefusingLines(lines, refused_in, in_flight)
    async with stdio_server(stdin=cast(Any, stdin)) as (read_stream, write_stream):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_answer_refusals, refused_out, write_stream)
            lowlevel = server._lowlevel_server
            await lowlevel.run(read_stream, cast(Any, _Answers(write_stream, in_flight)),
                               lowlevel.create_initialization_options())  # fmt: skip
            tasks.cancel_scope.cancel()
