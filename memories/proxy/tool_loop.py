"""Server-side memory tools in the chat proxy: agentic memory for any chat client.

The proxy offers ``manage_memory`` and ``search_memory`` (over the end user's scope
``["user", <id>]``) to the model beside the client's own tools, runs the calls the model
makes to them itself, sends the results back, and repeats, at most
``CHAT_TOOL_MAX_ROUNDS`` model calls in all: the last one is made without the memory
tools, so the loop always ends with an answer. A round that calls memory tools and none
of the client's goes on to the next one (the model reads the results), whether or not
it wrote text first; a round without memory calls, a round that also calls a client
tool, and the last round end the loop. Memory calls made in that final round run too,
and the client sees only its own calls (a turn left with none finishes with ``stop``).
What ran is reported as ``memory_tool_calls``, streamed or not.

JSON answers: the final round's answer goes to the client as the upstream sent it (its
bytes; only the memory calls are taken out of it), plus the report. Streamed answers:
nothing is sent while rounds only call memory tools; from a round's first text or client
call on, its events are relayed as they arrive (byte for byte, apart from the memory
calls' deltas taken out), so text written before a memory call is already with the
client and the next round's text follows it in the same message. A round's closing
chunks (finish, usage) wait until the round is known to be the last one.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from core.audit import acting_as
from core.errors import InvalidInput
from core.json_text import JsonText
from core.key_limits import tool_allowed
from core.providers.errors import ProviderError
from core.providers.json_answer import parse_arguments
from core.providers.llm import get_llm
from core.providers.relay import SSEEvent
from core.usage import usage_as
from memories.facts.scopes import user_scope
from memories.proxy.chat import (
    PreparedChat,
    Relayed,
    answer_text,
    chat_record,
    close_stream,
    enqueue_formation,
    error_event,
    formation_flush,
    proxy_usage,
    upstream_error,
    with_report,
)
from memories.tools.registry import ToolError, openai_tools, tool_call

MEMORY_TOOLS = ("manage_memory", "search_memory")
# How much of a memory call's unreadable arguments its report shows (as text).
REPORTED_TEXT = 2_000


def offer(request: JsonText, prepared: PreparedChat) -> JsonText:
    """The request with the memory tools added to the client's (those the request's key
    may call: ``core.key_limits``)."""
    client_tools = request.data.get("tools") or []
    taken = {t.get("function", {}).get("name") for t in client_tools if isinstance(t, dict)}
    if taken & set(MEMORY_TOOLS):
        said = (
            f"the request already has a tool named {sorted(taken & set(MEMORY_TOOLS))[0]}; "
            "rename it or leave memory_tools out"
        )
        raise InvalidInput.at("memory_tools", said)
    with acting_as(prepared.actor):
        ours = openai_tools([n for n in MEMORY_TOOLS if tool_allowed(n)])
    if isinstance(request.data.get("tools"), list):
        return request.append(("tools",), *ours)
    return request.set(("tools",), ours)


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
        # Read by the one parser (fences, prose, a <think> block, trailing commas,
        # JSON cut off): what it cannot read goes back to the model as an error.
        arguments = parse_arguments(function.get("arguments"))
        try:
            if arguments is None:  # (the report shows what was sent, as text)
                record["arguments"] = str(function.get("arguments"))[:REPORTED_TEXT]
                raise ToolError("the arguments are not valid JSON; send a JSON object")
            record["arguments"] = arguments
            with acting_as(prepared.actor):
                record["result"] = tool_call(
                    owner=prepared.owner_id, name=str(function.get("name")),
                    arguments=arguments, scope=user_scope(prepared.end_user.external_id),
                )  # fmt: skip
            content = record["result"]
        except ToolError as exc:
            record["error"] = str(exc)
            content = {"error": str(exc)}
        ran.append(record)
        messages.append(
            {"role": "tool", "tool_call_id": call.get("id"), "content": json.dumps(content)}
        )
    return messages


def _next_body(request: JsonText, content: str | None, calls: list[dict[str, Any]],
               results: list[dict[str, Any]]) -> JsonText:  # fmt: skip
    """The conversation goes on: the model's turn (its text, its memory calls), then the
    calls' results."""
    asked = {"role": "assistant", "content": content, "tool_calls": calls}
    return request.append(("messages",), asked, *results)


def _finish(chunk: Any) -> Any:
    try:
        return chunk["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


# --- JSON answers -------------------------------------------------------------------
def loop_complete(prepared: PreparedChat) -> bytes:
    llm = get_llm(feature="The chat proxy")
    conversation = prepared.request
    prepared.report["memory_tool_calls"] = []
    rounds = settings.CHAT_TOOL_MAX_ROUNDS
    for number in range(rounds):
        last = number == rounds - 1
        with usage_as(proxy_usage(prepared, "tool_loop")):
            answer = llm.relay((conversation if last else offer(conversation, prepared)).encode())
        message = _message(answer.data)
        calls = message.get("tool_calls") or []
        ours = [c for c in calls if isinstance(c, dict) and _ours(c)]
        if not ours:
            break
        results = run_calls(prepared, ours)
        if len(ours) < len(calls) or last:
            answer = _keep_client_calls(answer, calls)
            break
        conversation = _next_body(conversation, message.get("content"), ours, results)
    # The answer arrived: the turn teaches (a later round that failed, a 502, taught
    # nothing; what the memory tools wrote in the rounds before stays, as they did it).
    enqueue_formation(prepared)
    chat_record(prepared, answer_text(answer.data))
    return with_report(answer, prepared).encode()


def _keep_client_calls(answer: JsonText, calls: list[Any]) -> JsonText:
    """The turn as the client sees it: its own calls only (the memory calls taken out
    of the answer's text); none left, the turn stops."""
    path = ("choices", 0, "message", "tool_calls")
    if all(isinstance(c, dict) and _ours(c) for c in calls):
        answer = answer.remove(path)
        if _finish(answer.data) == "tool_calls":
            answer = answer.set(("choices", 0, "finish_reason"), "stop")
        return answer
    for index in reversed(range(len(calls))):
        if isinstance(calls[index], dict) and _ours(calls[index]):
            answer = answer.remove((*path, index))
    return answer


def _message(answer: dict[str, Any]) -> dict[str, Any]:
    try:
        message = answer["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {}
    return message if isinstance(message, dict) else {}


# --- streamed answers ---------------------------------------------------------------
def _delta(chunk: Any) -> dict[str, Any]:
    try:
        delta = chunk["choices"][0]["delta"]
    except (KeyError, IndexError, TypeError):
        return {}
    return delta if isinstance(delta, dict) else {}


def _closing(chunk: Any) -> bool:
    """A round's closing chunk: its finish, or a chunk without choices (usage)."""
    return isinstance(chunk, dict) and (chunk.get("choices") == [] or _finish(chunk) is not None)


def _frame(data: str) -> bytes:
    """An event of the proxy's making for ``data`` (one data line per line of it)."""
    return b"".join(b"data: " + line.encode() + b"\n" for line in data.split("\n")) + b"\n"


@dataclass
class _Calls:
    """One streamed model call's text and tool calls, put together from its deltas."""

    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    content: list[str] = field(default_factory=list)

    def add(self, chunk: dict[str, Any]) -> None:
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

    def client_calls(self) -> bool:
        return any(c["function"]["name"] and not _ours(c) for c in self.calls.values())

    def answering(self) -> bool:
        """Text, or a call to a client tool: this round is shown to the client."""
        return any(self.content) or self.client_calls()

    def ours(self) -> list[dict[str, Any]]:
        return [c for c in self.calls.values() if _ours(c)]

    def ours_indexes(self) -> set[int]:
        return {i for i, c in self.calls.items() if _ours(c)}


class _StreamRound:
    """One streamed model call: what it relays (``relay``, a generator) and, when the
    loop goes on, the turn to send back (``next``)."""

    def __init__(self, prepared: PreparedChat, relayed: Relayed, last: bool) -> None:
        self.prepared, self.relayed, self.last = prepared, relayed, last
        self.calls = _Calls()
        self.held: list[SSEEvent] = []  # read, not sent yet
        self.answering = self.failed = False
        self.next: tuple[str | None, list[dict[str, Any]], list[dict[str, Any]]] | None = None

    def relay(self, events: Iterator[SSEEvent]) -> Iterator[bytes]:
        for event in events:
            if event.done:
                self.relayed.done = event.raw
                continue
            error = upstream_error(event)
            if error is not None:
                if not self.relayed.started:
                    raise error  # nothing sent yet: the client gets a JSON error
                self.failed = True
                yield from self._send(final=True)
                yield self.relayed.sent(event)
                continue
            chunk = event.json()
            if isinstance(chunk, dict):
                self.calls.add(chunk)
            self.held.append(event)
            self.answering = self.answering or self.calls.answering()
            if self.answering:
                yield from self._send(final=False)
        ours = self.calls.ours()
        if ours and not self.calls.client_calls() and not self.last and not self.failed:
            content = "".join(self.calls.content) or None
            self.next = (content, ours, run_calls(self.prepared, ours))
            if self.answering:  # text that came with the finish still goes, unfinished
                yield from self._send(final=True, going_on=True)
            return  # what this round held back (its finish, its usage) is not sent
        if ours:  # beside a client call, or a stray call in the last round: run all the same
            run_calls(self.prepared, ours)
        yield from self._send(final=True)

    def _send(self, *, final: bool, going_on: bool = False) -> Iterator[bytes]:
        """The held events in order, the memory calls' deltas taken out; a round's
        closing chunks (and what follows them) wait for ``final``."""
        while self.held:
            event = self.held[0]
            chunk = event.json()
            if not final and _closing(chunk):
                return
            self.held.pop(0)
            raw = self._stripped(event, chunk, final=final, going_on=going_on)
            if raw is not None:
                yield self.relayed.sent(event, raw)

    def _stripped(self, event: SSEEvent, chunk: Any, *, final: bool,
                  going_on: bool) -> bytes | None:  # fmt: skip
        """The event without the memory calls' deltas (None: nothing left to send). In
        the final round a turn left with no call for the client finishes with stop; a
        round the loop goes on from sends only its text, finished by nothing."""
        if not isinstance(chunk, dict) or event.data is None:
            return None if going_on else event.raw
        delta = _delta(chunk)
        if going_on and not delta.get("content"):
            return None
        ours = self.calls.ours_indexes()
        pieces = delta.get("tool_calls") or []
        drop = [i for i, p in enumerate(pieces) if int(p.get("index", 0)) in ours]
        stop = (final and not going_on and bool(ours) and not self.calls.client_calls()
                and _finish(chunk) == "tool_calls")  # fmt: skip
        unfinish = going_on and _finish(chunk) is not None
        if not drop and not stop and not unfinish:
            return event.raw
        text = JsonText(event.data)
        path = ("choices", 0, "delta", "tool_calls")
        if drop and len(drop) == len(pieces):
            if not delta.get("content") and not delta.get("role") and _finish(chunk) is None:
                return None  # only memory calls in it
            text = text.remove(path)
        else:
            for index in reversed(drop):
                text = text.remove((*path, index))
        if stop or unfinish:
            text = text.set(("choices", 0, "finish_reason"), "stop" if stop else None)
        return _frame(text.text)


def loop_stream(prepared: PreparedChat) -> Iterator[bytes]:
    """The rounds run until there is something to send (an upstream failure before
    that raises: the client gets a JSON error); then the events, as they come."""
    events = _loop_events(prepared)
    first = next(events)

    def relayed() -> Iterator[bytes]:
        try:
            yield first
            yield from events
        finally:  # the client went away: the upstream's response is closed now
            events.close()

    return relayed()


def _loop_events(prepared: PreparedChat) -> Generator[bytes, None, None]:
    llm = get_llm(feature="The chat proxy")
    conversation = prepared.request
    prepared.report["memory_tool_calls"] = []
    relayed = Relayed(on_start=lambda: enqueue_formation(prepared))  # (the answer started)
    rounds = settings.CHAT_TOOL_MAX_ROUNDS
    try:
        for number in range(rounds):
            last = number == rounds - 1
            current = _StreamRound(prepared, relayed, last)
            try:
                body = (conversation if last else offer(conversation, prepared)).encode()
                events = llm.relay_stream(body, usage=proxy_usage(prepared, "tool_loop"))
                try:
                    yield from current.relay(events)
                finally:  # a round that ends early or fails: closed (and counted) now
                    close_stream(events)
            except ProviderError as exc:
                if not relayed.started:
                    raise
                relayed.failed = True
                yield error_event(exc)
                break
            if current.next is None:
                break
            conversation = _next_body(conversation, *current.next)
        yield from relayed.close(prepared)
    finally:  # the answer started: the turn teaches, recorded or not
        formation_flush(prepared)
