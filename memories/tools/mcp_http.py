"""``/mcp``: the MCP server over streamable HTTP inside the Django WSGI app.

The SDK's Starlette app runs on one asyncio loop in a daemon thread per process, behind
a2wsgi. Three traps, found by running it (see the commit and README):

- a2wsgi runs no ASGI lifespan, and the SDK's session manager refuses requests without
  its task group: the lifespan is entered once, on that loop, when the bridge starts;
- the server is stateless and answers JSON, so no request ever holds a thread open for
  a server-sent event stream (GET and DELETE answer 405 before reaching the SDK);
- the SDK's DNS-rebinding guard only accepts a 127.0.0.1/localhost Host: it is off, and
  Django's ALLOWED_HOSTS checks the Host as for every other endpoint.

The view authenticates the Bearer key like every API view, reads the body (to refuse what
is no JSON-RPC request MCP takes, ``jsonrpc_refusal``), puts it back in the WSGI environ and
hands the environ to a2wsgi; the owner travels in the environ to a contextvar.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import threading
from typing import Any, cast

import anyio
import anyio.to_thread
from a2wsgi import ASGIMiddleware
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.request import Request
from rest_framework.views import APIView

from core.audit import acting_as, actor
from core.tracing import attach_context, current_context, detach_context

# JSON-RPC error codes (JSON-RPC 2.0, section 5.1).
PARSE_ERROR, INVALID_REQUEST = -32700, -32600


def jsonrpc_refusal(raw: bytes) -> tuple[Any, int, str] | None:
    """What is wrong with a body that is no JSON-RPC message MCP takes: ``(id, code,
    message)``, or None. The SDK answers these with -32602 ("Invalid params") and a 2 KB
    dump of its validation, or takes a request whose id is null or an object for a
    notification (202, no answer ever comes); one message per request (no batches)."""
    try:
        message = json.loads(raw)
    except ValueError:  # (json.JSONDecodeError and UnicodeDecodeError are ValueErrors)
        return None, PARSE_ERROR, "Parse error: the body is not JSON."
    return message_refusal(message, raw)


def usable_id(value: Any) -> Any:
    """A message's id as an answer may repeat it: a string or an integer, else None."""
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


def message_refusal(message: Any, raw: str | bytes) -> tuple[Any, int, str] | None:
    """``jsonrpc_refusal`` of a body already parsed (``raw``: as it came): these
    reasons, then the SDK parser's (``params`` that are no object...: it answered them
    with -32602, a null id and its 2 KB dump over HTTP). (The SDK's words are those of
    its JSON reading: "an object", not "a dictionary".)"""
    from mcp.types import jsonrpc_message_adapter  # (1 s to import: at the first message)

    refused = _refusal(message)
    if refused is not None:
        return refused
    try:
        jsonrpc_message_adapter.validate_json(raw, by_name=False)
    except ValueError as exc:  # (pydantic's ValidationError, which mcp brings, is one)
        known = usable_id(message.get("id"))
        listed = getattr(exc, "errors", None)
        found: list[dict[str, Any]] = listed() if callable(listed) else []
        first = found[0] if found else None
        if first is None:
            return known, INVALID_REQUEST, "Invalid Request."
        where = ".".join(str(p) for p in first["loc"][1:]) or "the message"
        return known, INVALID_REQUEST, f"Invalid Request: {where}: {first['msg']}"
    return None


def _refusal(message: Any) -> tuple[Any, int, str] | None:
    if isinstance(message, list):
        return None, INVALID_REQUEST, "Invalid Request: send one JSON-RPC message, not a batch."
    if not isinstance(message, dict):
        return None, INVALID_REQUEST, "Invalid Request: a JSON-RPC message is a JSON object."
    known = usable_id(message.get("id"))
    if message.get("jsonrpc") != "2.0":
        return known, INVALID_REQUEST, 'Invalid Request: jsonrpc must be "2.0".'
    if "method" in message:
        if not isinstance(message["method"], str):
            return known, INVALID_REQUEST, "Invalid Request: method must be a string."
        if "id" in message and known is None:
            return (
                None,
                INVALID_REQUEST,
                (
                    "Invalid Request: id must be a string or an integer (MCP: not null); "
                    "leave it out for a notification."
                ),
            )
    elif "result" not in message and "error" not in message:
        return (
            known,
            INVALID_REQUEST,
            (
                "Invalid Request: a message has a method (a request or a notification), or a "
                "result or an error (a response)."
            ),
        )
    return None


# A JSON-RPC answer (schema only): the request's id, and its result or its error.
JSONRPC_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "jsonrpc": {"type": "string", "enum": ["2.0"]},
        "id": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        "result": {"type": "object", "description": "the method's result (MCP's shape)"},
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "data": {},
            },
            "required": ["code", "message"],
        },
    },
    "required": ["jsonrpc", "id"],
}
ENVIRON_OWNER = "memory.mcp_owner_id"
ENVIRON_VALUES = "memory.mcp_values"
ENVIRON_TRACE = "memory.mcp_trace"
ENVIRON_ACTOR = "memory.mcp_actor"
# Sync tools run in anyio worker threads, each with its own database connection: as many
# as gunicorn's threads, not anyio's default 40.
TOOL_THREADS = 4


class OwnerFromEnviron:
    """ASGI wrapper: the owner Django authenticated, as a contextvar for the tools (the
    stateless SDK starts each request's server task from this task, so it is inherited,
    and anyio copies it into the worker thread)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        environ = scope.get("wsgi_environ", {})
        owner = environ.get(ENVIRON_OWNER)
        if owner is None:  # only reachable by going around the view
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        from memories.tools.mcp_server import current_owner, current_values

        owner_token = current_owner.set(owner)
        values_token = current_values.set(environ.get(ENVIRON_VALUES) or {})
        trace_token = attach_context(environ.get(ENVIRON_TRACE))
        try:
            with acting_as(environ.get(ENVIRON_ACTOR)):
                await self.app(scope, receive, send)
        finally:
            detach_context(trace_token)
            current_owner.reset(owner_token)
            current_values.reset(values_token)


class _Bridge:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wsgi: ASGIMiddleware | None = None

    def wsgi(self) -> ASGIMiddleware:
        with self._lock:  # built on first use: after gunicorn forked its workers
            if self._wsgi is None:
                self._wsgi = self._start()
            return self._wsgi

    def _start(self) -> ASGIMiddleware:
        # The SDK on the first MCP request, not when the URLs load: half a second that
        # every process serving the API (and every manage.py check) would pay.
        from mcp.server.transport_security import TransportSecuritySettings

        from memories.tools.mcp_server import build_server

        app = build_server().streamable_http_app(
            streamable_http_path="/mcp",
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="mcp-loop", daemon=True).start()
        started = threading.Event()

        async def keep_running() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = TOOL_THREADS
            async with app.router.lifespan_context(app):  # the session manager's task group
                started.set()
                await anyio.sleep_forever()

        loop.call_soon_threadsafe(lambda: loop.create_task(keep_running()))
        if not started.wait(10):
            raise RuntimeError("the MCP session manager did not start")
        return ASGIMiddleware(cast(Any, OwnerFromEnviron(app)), loop=loop)


bridge = _Bridge()


class MCPView(APIView):
    """``POST /mcp``: MCP over streamable HTTP (stateless, JSON answers), for the owner
    of the Bearer key. Another method is a 405; a missing or wrong key a 401."""

    reads = True  # each tool that writes is refused to a read-only key (tools.registry)
    tools_may_write = True  # so it reads from the primary (core.replicas)

    @extend_schema(
        summary="MCP over streamable HTTP (the agent tools)",
        request={"application/json": {"type": "object", "description": "a JSON-RPC message"}},
        responses={
            (200, "application/json"): OpenApiResponse(
                response=JSONRPC_ANSWER_SCHEMA, description="the JSON-RPC answer"
            ),
            202: OpenApiResponse(description="a notification or response, accepted"),
            (400, "application/json"): OpenApiResponse(
                response=OpenApiTypes.OBJECT,
                description="not a JSON-RPC request MCP takes: a JSON-RPC error object "
                "(``error.code`` -32700 for a body that is not JSON, -32600 for an invalid "
                "request: a batch, jsonrpc other than 2.0, an id null or not a string or "
                "integer, a method that is not a string; -32602 for invalid params), or "
                "the API's error shape for input refused before MCP reads it (no body)",
            ),
            406: OpenApiResponse(
                response=OpenApiTypes.OBJECT,
                description="the Accept header does not take application/json (JSON-RPC error)",
            ),
            415: OpenApiResponse(
                response=OpenApiTypes.OBJECT,
                description="the body is not sent as application/json (the API's error shape)",
            ),
        },
    )
    def post(self, request: Request) -> HttpResponse | StreamingHttpResponse:
        environ = request._request.META  # the WSGI environ; the body is read below (_body)
        # The SDK answers a missing body or Content-Type with a text/plain 400 that no
        # client can parse: refuse them here, in the API's JSON error shape.
        # (a chunked body has its length by now: core.middleware read it, up to the limit)
        if environ.get("CONTENT_LENGTH", "") in ("", "0"):
            raise ParseError("The body must be a JSON-RPC message, sent as application/json.")
        media_type = (request.content_type or "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise UnsupportedMediaType(request.content_type or "(none)")
        raw = _body(environ)
        refused = jsonrpc_refusal(raw)
        if refused is not None:
            known, code, message = refused
            error = {"jsonrpc": "2.0", "id": known, "error": {"code": code, "message": message}}
            return JsonResponse(error, status=400)
        environ[ENVIRON_OWNER] = request.user.pk
        user_id = request.headers.get(settings.MEMORY_USER_HEADER)
        environ[ENVIRON_VALUES] = {"user_id": user_id} if user_id else {}
        environ[ENVIRON_TRACE] = current_context()  # the request's trace, for the tools' spans
        environ[ENVIRON_ACTOR] = actor()  # who acts (core.audit), for what the tools record
        environ["PATH_INFO"] = "/mcp"
        started: dict[str, Any] = {}

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> None:
            started["status"], started["headers"] = int(status.split()[0]), headers

        body = iter(cast(Any, bridge.wsgi())(environ, start_response))
        first = next(body, b"")  # a2wsgi calls start_response with the first body chunk
        response = StreamingHttpResponse(itertools.chain([first], body), status=started["status"])
        for name, value in started["headers"]:
            if name.lower() not in ("content-length", "connection"):
                response[name] = value
        return response


def _body(environ: dict[str, Any]) -> bytes:
    """The request's body, read and put back in the environ for the SDK."""
    raw = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
    environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(raw), str(len(raw))
    return raw


@extend_schema(exclude=True)
class MCPSlashView(MCPView):
    """``/mcp/`` for clients configured with a trailing slash (the schema lists ``/mcp``)."""
