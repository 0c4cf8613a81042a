"""Server-side memory tools in the chat proxy: agentic memory for any chat client.

The proxy offers ``manage_memory`` and ``search_memory`` (over the end user's scope
``["user", <id>]``) to the model beside the client's own tools, runs the calls the model
makes to them itself, sends the results back, and repeats, at most
``CHAT_TOOL_MAX_ROUNDS`` model calls in all: the last one is made without the memory
tools, so the loop always ends with an answer. That answer goes to the client as the
upstream gave it (streamed or not), plus ``memory_tool_calls``, what ran.

Rounds that call memory tools are buffered (nothing reaches the client); the first round
that answers (text, or a call to one of the client's tools) is relayed as it arrives.
When the model calls client tools and memory tools in one turn, the turn goes to the
client with only its own calls (in a JSON answer the memory calls run first; in a stream
the turn is relayed as it arrives, so they are left out unrun).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from django.conf import settings

from core.errors import InvalidInput
from core.providers.llm import get_llm
from memories.personal.chat import (
    PreparedChat,
    answer_text,
    chat_record,
    enqueue_formation,
    memories_payload,
    relay_events,
)
from memories.personal.scopes import user_scope
from memories.tools.registry import ToolError, openai_tools, tool_call

MEMORY_TOOLS = ("manage_memory", "search_memory")


def offer(body: dict[str, Any]) -> dict[str, Any]:
    """The request with the memory tools added to the client's."""
    client_tools = body.get("tools") or []
    taken = {t.get("function", {}).get("name") for t in client_tools if isinstance(t, dict)}
    if taken & set(MEMORY_TOOLS):
        raise InvalidInput(
            "memory_tools: the request already has a tool named "
            f"{sorted(taken & set(MEMORY_TOOLS))[0]}; rename it or leave memory_tools out",
            details={"memory_tools": "tool name taken"},
        )
    return {**body, "tools": [*client_tools, *openai_tools(MEMORY_TOOLS)]}


def _ours(call: dict[str, Any]) -> bool:
    return (call.get("function") or {}).get("name") in MEMORY_TOOLS


def run_calls(prepared: PreparedChat, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the memory tool calls; one ``tool`` message each (an error is a result too:
    the model reads the message and may try again)."""
    assert prepared.end_user is not None and prepared.end_user.external_id
    ran = prepared.report.setdefault("memory_tool_calls", [])
    messages = []
    for call in calls:
        function = call.get("function") or {}
        record: dict[str, Any] = {"name": function.get("name")}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            record["arguments"] = arguments
            record["result"] = tool_call(
                owner=prepared.owner_id, name=str(function.get("name")), arguments=arguments,
                scope=user_scope(prepared.end_user.external_id),
            )  # fmt: skip
            content = record["result"]
        except ValueError as exc:  # not JSON
            record["error"] = f"the arguments are not valid JSON ({exc}); send a JSON object"
            content = {"error": record["error"]}
        except ToolError as exc:
            record["error"] = str(exc)
            content = {"error": str(exc)}
        ran.append(record)
        messages.append(
            {"role": "tool", "tool_call_id": call.get("id"), "content": json.dumps(content)}
        )
    return messages


def _next_body(body: dict[str, Any], message: dict[str, Any], calls: list[dict[str, Any]],
               results: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    asked = {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
    return {**body, "messages": [*body["messages"], asked, *results]}


def _round_body(offered: dict[str, Any], original: dict[str, Any], last: bool) -> dict[str, Any]:
    if not last:
        return offered
    final = {**offered, "tools": original.get("tools")}  # the last call: no memory tools
    if final["tools"] is None:
        final.pop("tools")
        final.pop("tool_choice", None)
    return final


# --- JSON answers -------------------------------------------------------------------
def loop_complete(prepared: PreparedChat) -> dict[str, Any]:
    llm = get_llm(feature="The chat proxy")
    body = offer(prepared.body)
    prepared.report["memory_tool_calls"] = []
    rounds = settings.CHAT_TOOL_MAX_ROUNDS
    for number in range(rounds):
        answer = llm.relay(_round_body(body, prepared.body, number == rounds - 1))
        if number == 0:
            enqueue_formation(prepared)
        message = _message(answer)
        calls = message.get("tool_calls") or []
        ours = [c for c in calls if _ours(c)]
        if not ours:
            break
        results = run_calls(prepared, ours)
        if len(ours) < len(calls) or number == rounds - 1:
            _keep_client_calls(answer, message, calls)
            break
        body = _next_body(body, message, ours, results)
    chat_record(prepared, answer_text(answer))
    return {**answer, "memories": memories_payload(prepared), **prepared.report}


def _keep_client_calls(
    answer: dict[str, Any], message: dict[str, Any], calls: list[dict[str, Any]]
) -> None:
    """The turn as the client sees it: its own calls only; none left, the turn stops."""
    kept = [c for c in calls if not _ours(c)]
    if kept:
        message["tool_calls"] = kept
        return
    message.pop("tool_calls", None)
    choice = answer["choices"][0]
    if choice.get("finish_reason") == "tool_calls":
        choice["finish_reason"] = "stop"


def _message(answer: dict[str, Any]) -> dict[str, Any]:
    try:
        message = answer["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {}
    return message if isinstance(message, dict) else {}


# --- streamed answers ---------------------------------------------------------------
@dataclass
class _Round:
    """One streamed model call, read until it shows what it is."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    content: list[str] = field(default_factory=list)

    def add(self, chunk: dict[str, Any]) -> None:
        self.chunks.append(chunk)
        delta = _delta(chunk)
        self.content.append(str(delta.get("content") or ""))
        for piece in delta.get("tool_calls") or []:
            call = self.calls.setdefault(
                int(piece.get("index", 0)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = piece.get("id") or call["id"]
            function = piece.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def answering(self) -> bool:
        """Text, or a call to a client tool: this round goes to the client."""
        return any(self.content) or any(
            c["function"]["name"] and not _ours(c) for c in self.calls.values()
        )

    def ours(self) -> list[dict[str, Any]]:
        return [c for c in self.calls.values() if _ours(c)]


def _delta(chunk: dict[str, Any]) -> dict[str, Any]:
    try:
        delta = chunk["choices"][0]["delta"]
    except (KeyError, IndexError, TypeError):
        return {}
    return delta if isinstance(delta, dict) else {}


def _without_ours(chunks: Iterator[dict[str, Any]], ours: set[int]) -> Iterator[dict[str, Any]]:
    """The chunks with the memory tools' call deltas taken out (by their index); a turn
    left with no call for the client finishes with ``stop``, as a JSON answer does."""
    kept_any = False
    for chunk in chunks:
        delta = _delta(chunk)
        pieces = delta.get("tool_calls")
        if pieces:
            name = lambda p: (p.get("function") or {}).get("name")  # noqa: E731
            ours |= {int(p.get("index", 0)) for p in pieces if name(p) in MEMORY_TOOLS}
            kept = [p for p in pieces if int(p.get("index", 0)) not in ours]
            kept_any = kept_any or bool(kept)
            if not kept and not delta.get("content") and not delta.get("role"):
                continue
            chunk = json.loads(json.dumps(chunk))  # a copy: the delta changes
            _delta(chunk)["tool_calls"] = kept or None
            if not kept:
                _delta(chunk).pop("tool_calls")
        if ours and not kept_any and _finish(chunk) == "tool_calls":
            chunk = json.loads(json.dumps(chunk))
            chunk["choices"][0]["finish_reason"] = "stop"
        yield chunk


def _finish(chunk: dict[str, Any]) -> Any:
    try:
        return chunk["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def _read_on(current: _Round, stream: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for chunk in stream:
        current.add(chunk)
        yield chunk


def _then_run_ours(
    prepared: PreparedChat, current: _Round, chunks: Iterator[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """The answering round relayed; once it has ended, the memory calls the model made
    beside its answer or its client calls run (as in a JSON answer), so that the final
    chunk reports them."""
    yield from chunks
    ours = current.ours()
    if ours:
        run_calls(prepared, ours)


def loop_stream(prepared: PreparedChat) -> Iterator[bytes]:
    """Rounds that call memory tools run here, before anything is sent (an upstream
    error is still a JSON error); the answering round is relayed as it arrives."""
    llm = get_llm(feature="The chat proxy")
    body = offer(prepared.body)
    prepared.report["memory_tool_calls"] = []
    rounds = settings.CHAT_TOOL_MAX_ROUNDS
    for number in range(rounds):
        last = number == rounds - 1
        stream = llm.relay_stream(_round_body(body, prepared.body, last))
        current = _Round()
        for chunk in stream:
            current.add(chunk)
            if current.answering():
                break
        ours = current.ours()
        if current.answering() or not ours or last:
            indexes = {i for i, c in current.calls.items() if _ours(c)}
            read = list(current.chunks)
            chunks = _without_ours(chain(read, _read_on(current, stream)), indexes)
            chunks = _then_run_ours(prepared, current, chunks)
            first = next(chunks, None)
            return relay_events(prepared, first, chunks)
        results = run_calls(prepared, ours)
        message = {"content": "".join(current.content) or None}
        body = _next_body(body, message, ours, results)
    raise AssertionError("unreachable: the last round always answers")
