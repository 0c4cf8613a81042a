"""The MCP server over stdin/stdout (``manage.py mcp``), answering every request.

Why: the SDK's stdio transport reads a line that is not a JSON-RPC message (not JSON, a
batch, ``"jsonrpc": "1.0"``, ``params`` that are no object) and drops it without an
answer, takes a request whose id is null or an object for a notification (no answer
ever comes), and ends the server at the end of stdin with the requests still running
cancelled: a client that sends a request and closes its end (``printf ... | manage.py
mcp``) gets nothing. Each of these left the client waiting for its own timeout.

What: stdin goes through ``RefusingLines`` first. A line that is not JSON, or that
``message_refusal`` (the HTTP door's check) or the SDK's own parser refuses, is answered
with its JSON-RPC error (-32700 or -32600, the request's id when it had a usable one)
through the server's own writer, and not passed on. At the end of stdin those answers are written first, then
the lines end once every request passed on was answered or cancelled by the client
(``ANSWER_WAIT_SECONDS`` at most). The SDK's claims stay: stdout carries the protocol
only (stray output goes to stderr) and fd 0 reads the null device while serving (a
handler or a child that reads stdin cannot take protocol lines).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from io import TextIOWrapper
from typing import Any, cast

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import ErrorData, JSONRPCError, JSONRPCResponse

from memories.tools.mcp_http import PARSE_ERROR, message_refusal

ANSWER_WAIT_SECONDS = 120.0  # at the end of stdin, how long running requests may finish


class _InFlight:
    """The ids of the requests passed to the server and not answered (or cancelled)."""

    def __init__(self) -> None:
        self.ids: Counter[Any] = Counter()
        self.changed = anyio.Event()

    def add(self, request_id: Any) -> None:
        self.ids[request_id] += 1

    def done(self, request_id: Any) -> None:
        if self.ids[request_id] > 0:
            self.ids[request_id] -= 1
        self.ids += Counter()  # (drops the ids at zero)
        self.changed.set()
        self.changed = anyio.Event()

    async def drained(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.ids and time.monotonic() < deadline:
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await self.changed.wait()


class RefusingLines:
    """stdin's lines, less those that are no JSON-RPC message the server takes: each of
    those goes to ``refused`` as ``(id, code, message)``. At the end, once the refusals
    are written (``written``) and every request passed on was answered, the lines end."""

    def __init__(self, lines: Any, refused: Any, written: anyio.Event, in_flight: _InFlight):
        self.lines, self.refused, self.written = lines, refused, written
        self.in_flight = in_flight

    def __aiter__(self) -> AsyncIterator[str]:
        return self._read()

    async def _read(self) -> AsyncIterator[str]:
        async for line in self.lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                await self.refused.send((None, PARSE_ERROR, "Parse error: the line is not JSON."))
                continue
            refusal = message_refusal(message, line)
            if refusal is not None:
                await self.refused.send(refusal)
                continue
            if "method" in message and "id" in message:  # a request: an answer is due
                self.in_flight.add(message["id"])
            elif message.get("method") == "notifications/cancelled":  # none is, then
                self.in_flight.done((message.get("params") or {}).get("requestId"))
            yield line
        await self.refused.aclose()
        await self.written.wait()
        await self.in_flight.drained(ANSWER_WAIT_SECONDS)


class _Answers:
    """The server's send stream, noting each answer (a response or an error to a
    request) as it goes out."""

    def __init__(self, inner: Any, in_flight: _InFlight) -> None:
        self.inner, self.in_flight = inner, in_flight

    async def send(self, item: SessionMessage) -> None:
        await self.inner.send(item)
        if isinstance(item.message, JSONRPCResponse | JSONRPCError):
            self.in_flight.done(item.message.id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __aenter__(self) -> _Answers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.aclose()


async def _answer_refusals(refused: Any, write_stream: Any, written: anyio.Event) -> None:
    try:
        async for request_id, code, message in refused:
            error = ErrorData(code=code, message=message)
            await write_stream.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id,
                                                                error=error)))  # fmt: skip
    finally:
        written.set()


@contextmanager
def _stdin_claimed() -> Iterator[Any]:
    """stdin's lines on a descriptor of their own, fd 0 on the null device meanwhile (as
    the SDK's own claim does: nothing else reads protocol lines), given back after."""
    private = os.dup(0)
    saved = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        yield TextIOWrapper(os.fdopen(private, "rb"), encoding="utf-8", errors="replace")
    finally:
        os.dup2(saved, 0)
        os.close(saved)


async def serve_stdio(server: MCPServer) -> None:
    """Run ``server`` on this process's stdin and stdout (module doc)."""
    refused_in, refused_out = anyio.create_memory_object_stream[tuple[Any, int, str]](64)
    written, in_flight = anyio.Event(), _InFlight()
    with _stdin_claimed() as text:
        stdin = RefusingLines(anyio.wrap_file(text), refused_in, written, in_flight)
        async with stdio_server(stdin=cast(Any, stdin)) as (read_stream, write_stream):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_answer_refusals, refused_out, write_stream, written)
                lowlevel = server._lowlevel_server
                await lowlevel.run(read_stream, cast(Any, _Answers(write_stream, in_flight)),
                                   lowlevel.create_initialization_options())  # fmt: skip
                tasks.cancel_scope.cancel()
