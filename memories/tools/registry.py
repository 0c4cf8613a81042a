"""The agent tools, one definition for three doors.

Each tool is a name, a description a model reads, a JSON Schema of its arguments and a
function over a ``ToolContext`` (the owner, and the scope the call works in). The same
definition is served

- in process: ``memories.tools.callables.memory_tools(owner=..., scope=...)``, plain
  Python callables;
- over OpenAI function calling: ``GET /api/v1/tools`` lists ``openai_tools()``,
  ``POST /api/v1/tools/{name}/call`` runs ``tool_call``;
- over MCP: ``memories.tools.mcp_server`` registers every tool with the official SDK.

``tool_call`` is the one way in: it checks the arguments against the schema, runs the
tool, and turns every service error into a ``ToolError`` whose message says what to do
next (a model reads it and retries). Answers are plain JSON (dicts of strings, numbers,
lists), so the three doors answer the same bytes for the same call.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ObjectDoesNotExist

from core.audit import actor
from core.errors import ServiceError
from core.key_limits import NO_LIMITS, tool_allowed
from core.key_limits import current as key_limits
from memories.facts.scopes import ScopePath, scope_fill


class ToolError(ServiceError):
    """A tool call that did not happen, with a message a model can act on. It keeps the
    status of the error behind it (404 for an unknown memory id, 400 for bad arguments)."""

    status_code = 400
    code = "tool_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: Any = None,
    ):
        super().__init__(message, code=code, details=details)
        if status is not None:
            self.status_code = status


class ToolNotFound(ToolError):
    status_code = 404
    code = "tool_not_found"


@dataclass(frozen=True)
class ToolContext:
    """Who calls (the owner: every read and write stays in that tenant) and where: the
    scope (a list, possibly a template such as ``["user", "{user_id}"]`` filled from
    ``values``). Tools over node stores need no scope."""

    owner: AbstractBaseUser | int
    scope: Sequence[Any] | None = None
    values: Mapping[str, Any] = field(default_factory=dict)

    def filled_scope(self) -> ScopePath:
        if not self.scope:
            raise ToolError(
                "this tool works in a memory scope and none was given: pass scope, a list "
                'such as ["user", "alice"]',
                code="scope_required",
            )
        return scope_fill(list(self.scope), self.values)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[ToolContext, dict[str, Any]], dict[str, Any]]
    scoped: bool = True  # works in ToolContext.scope
    read_only: bool = False

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry (function calling)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


TOOLS: dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
    jsonschema.Draft202012Validator.check_schema(tool.parameters)
    TOOLS[tool.name] = tool
    return tool


def tool_get(name: str) -> Tool:
    from memories.tools import definitions  # noqa: F401  (the built-in tools register)

    try:
        return TOOLS[name]
    except KeyError:
        raise ToolNotFound(
            f"there is no tool named {name!r}; the tools are: {', '.join(sorted(TOOLS))}",
            details={"tools": sorted(TOOLS)},
        ) from None


def tool_list(names: Sequence[str] | None = None) -> list[Tool]:
    from memories.tools import definitions  # noqa: F401

    return [TOOLS[n] for n in (names or TOOLS)]


def openai_tools(names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    return [tool.openai() for tool in tool_list(names)]


def tools_offered() -> list[Tool]:
    """The tools the caller may run: all, or to a read-only key those that read, and to
    a key narrowed to named tools those (``core.key_limits``)."""
    narrowed = actor().read_only
    return [t for t in tool_list() if (t.read_only or not narrowed) and tool_allowed(t.name)]


def tools_unknown(owner_id: int, names: Sequence[str]) -> list[str]:
    """Of ``names``, those no tool has (a key's limits: ``core.key_limits``)."""
    known = {t.name for t in tool_list()}
    return [n for n in names if n not in known]


def _argument_error(error: jsonschema.ValidationError) -> ToolError:
    where = ".".join(str(p) for p in error.absolute_path)
    said = _said(error)
    if error.validator == "additionalProperties":
        message = f"{said}; the arguments are: {', '.join(error.schema['properties'])}"
    elif error.validator == "required":
        message = f"{said}: give it and call again"
    else:
        message = f"{where}: {said}" if where else said
    return ToolError(
        f"invalid arguments: {message}",
        code="invalid_arguments",
        details={where or "arguments": said},
    )


def _said(error: jsonschema.ValidationError) -> str:
    """jsonschema's message, without the whole value it quotes when that is long (200 kB
    of content came back twice in the error)."""
    if error.validator in ("maxLength", "minLength") and isinstance(error.instance, str):
        limit = error.validator_value
        kind = "longer" if error.validator == "maxLength" else "shorter"
        return f"{len(error.instance)} characters is {kind} than {limit}"
    return error.message if len(error.message) <= 500 else error.message[:500] + " ..."


def validate_arguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object", code="invalid_arguments")
    validator = jsonschema.Draft202012Validator(tool.parameters)
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        raise _argument_error(error)
    # Defaults filled here, so every door runs the tool with the same arguments.
    defaults = {
        key: spec["default"]
        for key, spec in tool.parameters["properties"].items()
        if "default" in spec
    }
    return {**defaults, **arguments}


def tool_call(
    *,
    owner: AbstractBaseUser | int,
    name: str,
    arguments: Any,
    scope: Sequence[Any] | None = None,
    values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run tool ``name`` for ``owner`` in ``scope``: the tool's JSON answer, or a
    ``ToolError`` (unknown tool 404, bad arguments 400, an unknown memory id 404...)."""
    tool = tool_get(name)
    if not tool_allowed(name):
        allowed = sorted((key_limits() or NO_LIMITS).tools or ())
        raise ToolError(
            f"this API key is limited to the tools {', '.join(allowed) or '(none)'}: it may "
            f"not call {name}",
            code="key_limit", status=403, details={"tools": name},
        )  # fmt: skip
    if not tool.read_only and actor().read_only:
        raise ToolError(
            f"this API key is read-only: {name} changes memory, and it may only read "
            "(the tools that read: " + ", ".join(t.name for t in tool_list() if t.read_only) + ")",
            code="read_only_key", status=403,
        )  # fmt: skip
    checked = validate_arguments(tool, arguments)
    context = ToolContext(owner=owner, scope=scope, values=dict(values or {}))
    try:
        return tool.run(context, checked)
    except ToolError:
        raise
    except ServiceError as exc:
        raise ToolError(
            str(exc), code=exc.code, status=exc.status_code, details=exc.details
        ) from exc
    except ObjectDoesNotExist as exc:
        raise ToolError(str(exc), code="not_found", status=404) from exc


def parse_uuid(value: str, *, what: str, hint: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ToolError(
            f"{what} {value!r} is not a valid id; {hint}", code="invalid_arguments"
        ) from None
