"""Door 1: the tools as plain Python callables, bound to an owner and a scope, for any
agent framework that takes functions (LangGraph, the OpenAI Agents SDK, LangChain's
``tool()``...)::

    from memories.tools.callables import memory_tools

    manage_memory, search_memory = memory_tools(owner=user, scope=["user", "alice"])
    manage_memory("User prefers dark mode")            # {"action": "created", "id": ...}
    search_memory("which theme?", limit=5)              # {"mode": ..., "results": [...]}

They run the same ``tool_call`` as the HTTP and MCP doors, so they answer the same
dicts and raise the same ``ToolError`` (its message tells a model what to do next).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from memories.tools.registry import tool_call, tool_get


def memory_tools(
    *,
    owner: AbstractBaseUser | int,
    scope: Sequence[Any],
    values: Mapping[str, Any] | None = None,
) -> tuple[Callable[..., dict[str, Any]], Callable[..., dict[str, Any]]]:
    """``manage_memory(content, action, id)`` and ``search_memory(query, limit, offset,
    filter)`` over ``scope`` (a template such as ``["user", "{user_id}"]`` is filled
    from ``values``)."""

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        given = {k: v for k, v in arguments.items() if v is not None}
        return tool_call(owner=owner, name=name, arguments=given, scope=scope, values=values)

    def manage_memory(
        content: str | None = None,
        action: str = "create",
        id: str | None = None,
        category: str | None = None,
    ) -> dict[str, Any]:
        return call(
            "manage_memory", {"content": content, "action": action, "id": id, "category": category}
        )

    def search_memory(
        query: str, limit: int = 10, offset: int = 0, filter: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return call("search_memory", {"query": query, "limit": limit, "offset": offset,
                                      "filter": filter})  # fmt: skip

    manage_memory.__doc__ = tool_get("manage_memory").description
    search_memory.__doc__ = tool_get("search_memory").description
    return manage_memory, search_memory


def node_memory_tools(
    *, owner: AbstractBaseUser | int
) -> tuple[Callable[..., dict[str, Any]], Callable[..., dict[str, Any]]]:
    """``retrieve_node_memory(flow, node_id, query, stage)`` and
    ``write_node_memory(flow, node_id, input, output)`` over the owner's memory stores."""

    def retrieve_node_memory(
        flow: str, node_id: str, query: str, stage: str = "pre", session_id: str = "",
        max_tokens: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        arguments = {"flow": str(flow), "node_id": node_id, "query": query, "stage": stage,
                     "session_id": session_id, "max_tokens": max_tokens}  # fmt: skip
        given = {k: v for k, v in arguments.items() if v is not None}
        return tool_call(owner=owner, name="retrieve_node_memory", arguments=given)

    def write_node_memory(
        flow: str, node_id: str, input: str, output: str, session_id: str = ""
    ) -> dict[str, Any]:
        arguments = {"flow": str(flow), "node_id": node_id, "input": input, "output": output,
                     "session_id": session_id}  # fmt: skip
        return tool_call(owner=owner, name="write_node_memory", arguments=arguments)

    retrieve_node_memory.__doc__ = tool_get("retrieve_node_memory").description
    write_node_memory.__doc__ = tool_get("write_node_memory").description
    return retrieve_node_memory, write_node_memory
