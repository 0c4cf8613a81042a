"""Door 3: the same tools as a Model Context Protocol server (the official ``mcp`` SDK,
2.x: ``MCPServer``), plus read-only resources: a scope's ``MEMORY.md`` and its journal days.

The tools are not re-declared from Python signatures: ``tools/list`` answers each tool's
own JSON Schema (the one ``GET /api/v1/tools`` lists) with a ``scope`` argument added, and
``tools/call`` runs ``tool_call``, so the answers are the other doors' answers (as
``structuredContent``, and as JSON text). A failed call (a ``ToolError``: bad arguments,
an unknown memory id...) comes back as a tool result with ``isError`` and the same
actionable message, for the model to read; an unknown tool or resource is a JSON-RPC
protocol error (-32602), as the MCP specification has it.

Who calls: ``current_owner`` (the HTTP view sets it from the Bearer key, ``manage.py mcp``
from ``--owner``). ``served_scope`` is the one scope a stdio server was started for
(``--scope``), else None (each call names its scope).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from datetime import date
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import anyio.to_thread
from django.db import close_old_connections
from mcp import MCPError
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.mcpserver.exceptions import ToolError as MCPToolError
from mcp.types import (
    INVALID_PARAMS,
    CallToolResult,
    Resource,
    ResourceTemplate,
    TextContent,
    ToolAnnotations,
)
from mcp.types import (
    Tool as MCPTool,
)

from core import tenancy
from core.api.parsers import UnstorableInput, check_parsed, unstorable_message
from core.errors import ServiceError
from memories.engine import files
from memories.engine.dreams import memory_md_read
from memories.facts.scopes import ScopePath, scope_find, scope_parse
from memories.facts.selectors import scopes_of_owner
from memories.tools.registry import (
    Tool,
    ToolError,
    ToolNotFound,
    tool_call,
    tool_get,
    tools_offered,
)

current_owner: ContextVar[int | None] = ContextVar("mcp_owner", default=None)
served_scope: ContextVar[ScopePath | None] = ContextVar("mcp_scope", default=None)
current_values: ContextVar[dict[str, Any]] = ContextVar("mcp_values", default={})  # noqa: B039

MAX_LISTED_SCOPES = 100
INSTRUCTIONS = (
    "Long-term memory. Call search_memory before answering questions about the user or "
    "earlier work; call manage_memory to remember a durable fact, or to correct or forget "
    "one. Memories live in a scope, a list such as ['user', 'alice']. Read a scope's "
    "MEMORY.md resource for everything it holds."
)
SCOPE_SCHEMA = {
    "type": "array",
    "items": {"type": "string"},
    "minItems": 1,
    "maxItems": 8,
    "description": "The memory scope, e.g. ['user', 'alice'].",
}
RESOURCE = re.compile(
    r"^memory://scope/(?P<scope>[^/]+)/(?:MEMORY\.md|journal/(?P<day>[^/]+)\.md)$"
)

T = TypeVar("T")


def scope_uri(scope: Iterable[str], day: date | None = None) -> str:
    """``memory://scope/user,alice/MEMORY.md``: segments joined by commas (a character
    no segment may hold), each percent-encoded."""
    encoded = ",".join(quote(s, safe="") for s in scope)
    tail = f"journal/{day.isoformat()}.md" if day else "MEMORY.md"
    return f"memory://scope/{encoded}/{tail}"


def _owner() -> int:
    owner = current_owner.get()
    if owner is None:  # the HTTP view and the command always set it
        raise ToolError("not authenticated", status=401)
    return owner


def _scope(requested: Any) -> list[Any] | None:
    if requested is not None and not isinstance(requested, list):
        # (a string was read as its characters: "user" wrote to the scope u/s/e/r)
        raise ToolError(
            f"scope must be a list of strings such as ['user', 'alice'], not {requested!r:.80}",
            code="invalid",
            status=400,
        )
    fixed = served_scope.get()
    if fixed is None:
        return requested
    if requested is not None and tuple(requested) != fixed:
        raise ToolError(
            f"scope {list(requested)} is not open to this server; it serves {list(fixed)} "
            "(leave scope out)",
            code="scope_not_served",
            status=403,
        )
    return list(fixed)


def _orm(fn: Callable[[], T]) -> Callable[[], T]:
    """The ORM runs in anyio worker threads, outside Django's request cycle: close
    connections as request_started/finished would."""

    def run() -> T:
        close_old_connections()
        owner = current_owner.get()
        try:
            with tenancy.as_owner(owner) if owner is not None else tenancy.nobody():
                return fn()
        finally:
            close_old_connections()

    return run


def _mcp_tool(tool: Tool) -> MCPTool:
    schema = dict(tool.parameters)
    # A server started for one scope (stdio ``--scope``) does not offer the choice: a
    # model shown a ``scope`` property fills it in (an explicit scope equal to the served
    # one is still accepted, any other is refused).
    if tool.scoped and served_scope.get() is None:
        schema["properties"] = {"scope": SCOPE_SCHEMA, **schema["properties"]}
    return MCPTool(
        name=tool.name,
        description=tool.description,
        input_schema=schema,
        annotations=ToolAnnotations(read_only_hint=tool.read_only),
    )


class MemoryMCPServer(MCPServer):
    """``MCPServer`` whose tools and resources come from the tool registry and the engine."""

    async def list_tools(self) -> list[MCPTool]:
        """Every tool, or to a read-only key the tools that read (the others refuse it)."""
        return [_mcp_tool(t) for t in tools_offered()]

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(_mcp_tool(tool_get(name)).input_schema)
        except ToolError:
            return None

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Any = None
    ) -> CallToolResult:
        try:
            tool_get(name)
        except ToolNotFound as exc:  # the spec: a protocol error, not a failed tool run
            raise MCPError(code=INVALID_PARAMS, message=str(exc), data=exc.details) from exc
        arguments = dict(arguments)
        try:  # (what the database cannot store, refused as at every door: NUL, surrogates)
            check_parsed(arguments)
        except UnstorableInput as exc:
            raise MCPToolError(f"arguments.{unstorable_message(exc)}") from None
        scope = arguments.pop("scope", None)

        def call() -> dict[str, Any]:
            return tool_call(
                owner=_owner(), name=name, arguments=arguments, scope=_scope(scope),
                values=current_values.get(),
            )  # fmt: skip

        try:
            result = await anyio.to_thread.run_sync(_orm(call))
        except ServiceError as exc:  # ToolError and every service error: the model reads it
            raise MCPToolError(str(exc)) from exc
        return CallToolResult(
            content=[TextContent(type="text", text=json.dumps(result))],
            structured_content=result,
        )

    async def list_resources(self) -> list[Resource]:
        def listed() -> list[Resource]:
            fixed = served_scope.get()
            scopes = [list(fixed)] if fixed else scopes_of_owner(owner_id=_owner())
            return [
                Resource(
                    uri=scope_uri(s),
                    name=f"{'/'.join(s)} MEMORY.md",
                    mime_type="text/markdown",
                    description="The scope's core facts as Markdown, by category (read-only).",
                )  # fmt: skip
                for s in scopes[:MAX_LISTED_SCOPES]
            ]

        return await anyio.to_thread.run_sync(_orm(listed))

    async def list_resource_templates(self) -> list[ResourceTemplate]:
        return [
            ResourceTemplate(
                uri_template="memory://scope/{scope}/MEMORY.md", name="MEMORY.md",
                mime_type="text/markdown",
                description="A scope's core facts (scope: segments joined by commas).",
            ),
            ResourceTemplate(
                uri_template="memory://scope/{scope}/journal/{day}.md", name="journal day",
                mime_type="text/markdown", description="A scope's journal of one day (YYYY-MM-DD).",
            ),
        ]  # fmt: skip

    async def read_resource(self, uri: Any, context: Any = None) -> list[ReadResourceContents]:
        text = await anyio.to_thread.run_sync(_orm(lambda: resource_text(str(uri))))
        return [ReadResourceContents(content=text, mime_type="text/markdown")]


def resource_text(uri: str) -> str:
    """The text of ``memory://scope/<scope>/MEMORY.md`` (rendered from the scope's facts,
    fresh: what a dream reads) or ``.../journal/<day>.md``, for the calling owner only."""
    match = RESOURCE.match(uri)
    if match is None:
        raise ResourceNotFoundError(f"Unknown resource: {uri}")
    try:
        scope = scope_parse([unquote(s) for s in match["scope"].split(",")])
        scope = tuple(_scope(list(scope)) or scope)
    except ServiceError as exc:
        raise ResourceNotFoundError(f"{exc} ({uri})") from None
    row = scope_find(owner=_owner(), scope=scope)
    if row is None:
        raise ResourceNotFoundError(f"no scope {list(scope)} ({uri})")
    if match["day"] is None:
        return memory_md_read(row)
    try:
        return files.journal_read(
            owner_id=row.owner_id, scope=list(scope), day=files.parse_day(match["day"])
        )
    except ServiceError as exc:
        raise ResourceNotFoundError(f"{exc} ({uri})") from None


def build_server() -> MemoryMCPServer:
    return MemoryMCPServer("memory", instructions=INSTRUCTIONS)
