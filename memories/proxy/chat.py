"""The OpenAI-compatible chat proxy: retrieve memories, inject them, forward, learn.

Anonymous requests (no end-user id) take the same answer path without retrieval
or formation. Formation is queued only once the upstream answer has started (the
JSON answer arrived, or the first streamed chunk), after the request's
transaction commits, so a failed request never writes a memory.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core import replicas
from core.api.errors import openai_error_body
from core.audit import Actor, actor
from core.errors import Conflict, KeyLimitExceeded
from core.json_text import JsonText
from core.key_limits import current as key_limits
from core.key_limits import resource_check, resource_create_check
from core.providers.errors import ProviderError
from core.providers.llm import get_llm
from core.providers.relay import SSEEvent
from core.queue import enqueue_on_commit
from core.usage import Attribution, usage_as
from memories.bases.services import ingestion_trigger
from memories.conversations.models import Flow
from memories.conversations.selectors import flow_find, session_has_other_sender
from memories.conversations.services import MessageIn, flow_ensure, messages_store, session_lock
from memories.facts.injection import format_for_injection
from memories.facts.models import Scope
from memories.facts.scopes import end_user_ensure, end_user_unmake, scope_find, user_scope
from memories.facts.services import scope_held_if_there

logger = logging.getLogger(__name__)

MEMORY_BLOCK_HEADER = (
    "Long-term memories about the user, from earlier conversations. They may or may not be "
    "relevant: use the ones that help answer the current message and ignore the rest. "
    "Do not mention this list unless asked."
)


@dataclass(frozen=True)
class InjectedMemory:
    """A fact the block holds, as the answer's ``memories`` lists it: the fact's id,
    content, category and confidence; ``type`` (``memory``, or ``global`` for one of the
    owner's global memories); ``relevant`` (the search found it relevant to the message:
    then its search ``score`` and ``similarity``; the others fill the budget by
    confidence and have neither)."""

    id: uuid.UUID
    content: str
    category: str
    confidence: float
    type: str
    relevant: bool
    score: float | None
    similarity: float | None


@dataclass
class PreparedChat:
    # the request for the upstream: the client's body as it came, edited in place
    request: JsonText
    owner_id: int = 0
    memories: list[InjectedMemory] = field(default_factory=list)
    end_user: Scope | None = None
    # this request's token (``end_user_ensure``'s ``made_by``): an end user it makes is
    # taken back if its upstream fails (``unmade_on_failure``)
    token: uuid.UUID = field(default_factory=uuid.uuid4)
    external_id: str | None = None  # the end user's id the request named
    user_text: str = ""
    received_at: datetime = field(default_factory=timezone.now)
    # Open WebUI's forwarded headers: the chat becomes a conversation (history, summaries)
    chat_id: str | None = None
    chat_sender: str = ""  # who the chat's user messages are from (``chat_sender``)
    user_name: str = ""
    user_email: str = ""
    # extra fields reported beside ``memories`` (the server-side memory tools' calls)
    report: dict[str, Any] = field(default_factory=dict)
    # the turn teaches, and waits for chat_record to name the recorded message
    formation_pending: bool = False
    # who asked (``core.audit``): the tool loop's calls run as the request's key, its
    # limits included, also in a stream's later rounds (served after the view returned)
    actor: Actor | None = None

    @property
    def body(self) -> dict[str, Any]:
        """The request, parsed (to read; changes go through ``request``)."""
        return cast(dict[str, Any], self.request.data)


def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def inject(request: JsonText, block: str) -> JsonText:
    """The block appended to the first system (or developer) message, or a system
    message in front: spliced into the text, the rest of the request unchanged."""
    if not block:
        return request
    for index, message in enumerate(request.data["messages"]):
        if message.get("role") in ("system", "developer") and isinstance(
            message.get("content"), str
        ):
            return request.extend_string(("messages", index, "content"), f"\n\n{block}")
    return request.insert(("messages",), 0, {"role": "system", "content": block})


def chat_prepare(
    *,
    owner_id: int,
    body: dict[str, Any] | JsonText,
    external_id: str | None,
    chat_id: str | None = None,
    user_name: str = "",
    user_email: str = "",
    token: uuid.UUID | None = None,
) -> PreparedChat:
    """Resolve the end user, retrieve their memories and build the upstream request:
    ``body`` as the client sent it (its bytes, given a ``JsonText``), the memory block
    added to the system prompt, ``model`` added when it names none."""
    request = body if isinstance(body, JsonText) else JsonText.of(body)
    if "model" not in request.data:
        request = request.set(("model",), settings.LLM_MODEL)
    prepared = PreparedChat(
        request=request, owner_id=owner_id, chat_id=chat_id, user_name=user_name,
        user_email=user_email, actor=actor(), chat_sender=chat_sender(external_id),
        token=token or uuid.uuid4(), external_id=external_id,
    )  # fmt: skip
    users = [m for m in prepared.body["messages"] if m.get("role") == "user"]
    prepared.user_text = message_text(users[-1].get("content")) if users else ""
    if not external_id:
        return prepared
    prepared.end_user = end_user_ensure(
        owner=owner_id, external_id=external_id, made_by=prepared.token
    )
    if not prepared.user_text.strip():
        return prepared
    block, prepared.memories = memory_block(
        owner_id=owner_id, end_user=prepared.end_user, query=prepared.user_text
    )
    prepared.request = inject(prepared.request, block)
    return prepared


@contextmanager
def unmade_on_failure(prepared: PreparedChat) -> Iterator[None]:
    """An end user first seen by this request, whose upstream then failed before the
    answer began, is taken back (``end_user_unmake``): a failed request writes nothing.
    One another request has used meanwhile, or anything refers to, stays."""
    try:
        yield
    except ProviderError:
        if prepared.external_id:
            end_user = prepared.end_user or scope_find(
                owner=prepared.owner_id, scope=user_scope(prepared.external_id)
            )
            if end_user is not None:
                end_user_unmake(end_user, prepared.token)
        raise


def chat_sender(external_id: str | None) -> str:
    """The ``sender`` of a chat's user messages: the end user's id, or ``user`` for a
    request that names none."""
    return (external_id or "user")[:100]


def chat_check(*, owner_id: int, chat_id: str | None, external_id: str | None) -> None:
    """Before anything runs, whether a turn may join the chat its chat id names (the
    conversation ``chat_id`` of the owner's ``CHAT_PROXY_FLOW`` flow, ``chat_record``):

    - a chat is its end user's: one whose user messages another end user sent (or a
      request without one) takes no turn of this one, so no end user writes into
      another's history, nor takes it along when erased: a 409 ``conflict`` (a 403
      ``key_limit`` to a narrowed key, whose reach it is outside);
    - a key narrowed on flows records in that flow only when it reaches it (and creates
      it only when not narrowed on flows), unless the key is narrowed to a scope: then
      the chat is its end user's own, recorded with them and erased with them.
    """
    if not chat_id:
        return
    flow = flow_find(owner_id=owner_id, name=settings.CHAT_PROXY_FLOW)
    limits = key_limits()
    if limits is not None and limits.scope is None:
        if flow is None:
            resource_create_check("flows")
        else:
            resource_check("flows", flow.pk)
    if flow is not None and _taken(flow, chat_id, chat_sender(external_id)):
        refused = KeyLimitExceeded if limits is not None else Conflict
        raise refused(
            f"chat {chat_id!r} is another end user's: a chat takes the turns of the end user "
            "it began with only",
            details={settings.MEMORY_CHAT_HEADER: chat_id},
        )


def _taken(flow: Flow, chat_id: str, sender: str) -> bool:
    return session_has_other_sender(flow=flow, session_id=chat_id, sender=sender)


def memory_block(*, owner_id: int, end_user: Scope, query: str) -> tuple[str, list[InjectedMemory]]:
    """The system-prompt block within ``MEMORY_PROMPT_MAX_TOKENS``: the user's facts as
    the engine injects them (``format_for_injection``: corrections' share, then the
    facts the one search finds relevant to ``query`` in its order, then the rest by
    confidence); for a user with fewer than ``MEMORY_GLOBAL_MIN_PERSONAL`` facts, the
    owner's global memories relevant to it follow while they fit. An embedder failure
    leaves the search keyword-only, never the answer."""
    injection = format_for_injection(
        owner=owner_id, scope=end_user, max_tokens=settings.MEMORY_PROMPT_MAX_TOKENS,
        query=query, header=MEMORY_BLOCK_HEADER, with_globals=True,
    )  # fmt: skip
    memories = []
    for fact in injection.facts:
        hit = injection.relevant.get(fact.pk)
        memories.append(InjectedMemory(
            fact.pk, fact.content, fact.category, fact.confidence, "memory", hit is not None,
            hit.score if hit else None, hit.similarity if hit else None,
        ))  # fmt: skip
    memories += [
        InjectedMemory(
            h.id, h.content, h.category, h.confidence, "global", True, h.score, h.similarity
        )  # fmt: skip
        for h in injection.globals
    ]
    return injection.text, memories


def memories_payload(prepared: PreparedChat) -> list[dict[str, Any]]:
    return [
        {
            "id": str(m.id),
            "content": m.content,
            "category": m.category,
            "confidence": m.confidence,
            "type": m.type,
            "relevant": m.relevant,
            "score": m.score,
            "similarity": m.similarity,
        }  # fmt: skip
        for m in prepared.memories
    ]


def enqueue_formation(prepared: PreparedChat) -> None:
    """Learning is best effort: the answer is delivered whether or not this queues. Only
    a new user turn teaches: a request that sends a tool's result back repeats the user
    message the model already learned from. With a chat id the turn is recorded once
    its answer has arrived, and ``chat_record`` queues the learning then, naming the
    recorded message (the facts' source); ``formation_flush`` queues it without one if
    the turn never gets recorded (a stream cut short)."""
    if prepared.end_user is None or not prepared.user_text.strip() or not _user_turn(prepared):
        return
    if prepared.chat_id:
        prepared.formation_pending = True
        return
    _queue_formation(prepared, "")


def formation_flush(prepared: PreparedChat) -> None:
    """Queue a learning ``chat_record`` did not get to (see ``enqueue_formation``)."""
    if prepared.formation_pending:
        _queue_formation(prepared, "")


def _queue_formation(prepared: PreparedChat, message_id: str) -> None:
    assert prepared.end_user is not None
    prepared.formation_pending = False
    enqueue_on_commit(
        "ingestion.tasks.form_memories",
        prepared.end_user.owner_id,
        prepared.end_user.external_id,
        prepared.user_text,
        prepared.received_at.isoformat(),
        message_id,
        prepared.end_user.pk,  # (erased since, nothing is learned)
        task_name="form-memories",
        owner_id=prepared.end_user.owner_id,
    )


def answer_text(answer: dict[str, Any]) -> str:
    try:
        return message_text(answer["choices"][0]["message"].get("content"))
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""


def _user_turn(prepared: PreparedChat) -> bool:
    messages = prepared.body.get("messages") or []
    return bool(messages) and messages[-1].get("role") == "user"


def chat_record(prepared: PreparedChat, text: str) -> None:
    """With a chat id (Open WebUI's ``X-OpenWebUI-Chat-Id``): the turn joins the
    conversation ``chat_id`` of the owner's ``CHAT_PROXY_FLOW`` flow, as the user saw it,
    so ``/api/v1/conversations/{chat_id}/history`` and the engine's summaries read it:
    a new user message (once its answer has arrived), and the answer when it has text.
    An answer that is only tool calls waits for the request that sends the tools'
    results back, whose answer is recorded then (an empty answer would read as one
    still pending, and hide the question from the history). Once the user's message is
    recorded, the learning the turn waits for is queued with its id (the facts'
    source)."""
    if not prepared.chat_id:
        return
    messages = []
    sender = prepared.chat_sender or chat_sender(None)
    if _user_turn(prepared):
        name = prepared.user_name
        if prepared.user_email:
            name = f"{name} <{prepared.user_email}>".strip()
        messages.append(MessageIn(role="user", text=prepared.user_text,
                                  sender=sender, sender_name=name[:200]))  # fmt: skip
    if text.strip():
        messages.append(MessageIn(role="assistant", text=text))
    if not messages:
        return
    with transaction.atomic():
        if prepared.end_user is not None and not scope_held_if_there(prepared.end_user):
            # erased while the answer came: the turn is not recorded, nor learned from
            logger.info("chat turn not recorded: its end user was erased meanwhile")
            prepared.formation_pending = False
            return
        flow = flow_ensure(owner_id=prepared.owner_id, name=settings.CHAT_PROXY_FLOW)
        session_lock(flow, prepared.chat_id)
        if _taken(flow, prepared.chat_id, sender):  # (another end user's first turn won)
            logger.warning("chat turn not recorded: its chat is another end user's")
            return
        stored = messages_store(flow=flow, session_id=prepared.chat_id,
                                run_id=f"chat-{uuid.uuid4().hex}", messages=messages)  # fmt: skip
        ingestion_trigger(flow=flow, session_id=prepared.chat_id)  # (memory bases of the flow)
    replicas.wrote(prepared.owner_id)  # (a streamed turn: before its [DONE] goes out)
    if prepared.formation_pending and messages[0].role == "user":
        _queue_formation(prepared, str(stored[0].pk))


def with_report(answer: JsonText, prepared: PreparedChat) -> JsonText:
    """The upstream's JSON answer with ``memories`` (and the report's fields) added as
    top-level members; its own bytes unchanged."""
    for key, value in {"memories": memories_payload(prepared), **prepared.report}.items():
        answer = answer.set((key,), value)
    return answer


def proxy_usage(prepared: PreparedChat, kind: str = "proxy") -> Attribution:
    """Whose the proxy's upstream calls are (``core.usage``): the key's owner, about its
    end user."""
    subject = prepared.end_user.label if prepared.end_user is not None else ""
    return Attribution(prepared.owner_id or None, kind, subject)


def chat_complete(prepared: PreparedChat) -> bytes:
    """Forward once; the upstream's JSON comes back byte for byte, plus ``memories``."""
    with usage_as(proxy_usage(prepared)):
        answer = get_llm(feature="The chat proxy").relay(prepared.request.encode())
    enqueue_formation(prepared)
    chat_record(prepared, answer_text(answer.data))
    return with_report(answer, prepared).encode()


def memories_chunk(prepared: PreparedChat, first: dict[str, Any]) -> dict[str, Any]:
    """The last event of a stream with a user: an ordinary chunk with no choices (as
    OpenAI's usage chunk), carrying the injected ``memories``; clients ignore it safely."""
    return {
        "id": first.get("id", ""),
        "object": "chat.completion.chunk",
        "created": first.get("created", 0),
        "model": first.get("model", ""),
        "choices": [],
        "memories": memories_payload(prepared),
        **prepared.report,
    }


def delta_text(chunk: dict[str, Any]) -> str:
    try:
        return str(chunk["choices"][0]["delta"].get("content") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""


def sse(data: dict[str, Any]) -> bytes:
    """An event of the proxy's own (the memories chunk, an error)."""
    return f"data: {json.dumps(data)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


def upstream_error(event: SSEEvent) -> ProviderError | None:
    """An error the upstream sent as an event (OpenAI's ``{"error": {...}}``)."""
    chunk = event.json()
    if not isinstance(chunk, dict) or "error" not in chunk:
        return None
    error = chunk["error"]
    message = error.get("message") if isinstance(error, dict) else error
    return ProviderError(f"provider sent an error: {message}")


def error_event(exc: ProviderError) -> bytes:
    """An upstream failure after the stream began, as an event in OpenAI's error shape:
    the same body a failure before it gets as JSON (``type`` api_error, ``code`` a
    string, ``param``)."""
    return sse(openai_error_body(exc.status_code, exc.code, str(exc)))


def stream_opening(events: Iterator[SSEEvent]) -> list[SSEEvent]:
    """The events up to the first one with data (comments before it included), read
    before anything is sent: a failure or an error event there is raised, so the client
    gets a JSON error; [] for a stream that ended at once."""
    opening = []
    for event in events:
        opening.append(event)
        if event.data is not None:
            error = upstream_error(event)
            if error is not None:
                raise error
            break
    return opening


def chat_stream(prepared: PreparedChat) -> Iterator[bytes]:
    """Server-sent events relayed from upstream byte for byte. Errors before the first
    event raise (the caller answers with a JSON error); later ones end the stream with
    an error event. With a user, a chunk carrying ``memories`` comes before
    ``data: [DONE]``."""
    events = get_llm(feature="The chat proxy").relay_stream(
        prepared.request.encode(), usage=proxy_usage(prepared)
    )
    try:
        opening = stream_opening(events)
    except BaseException:
        # Closed here, not when collected: closing counts the call's tokens (a database
        # write, which must not run from a finaliser in whatever thread collects it).
        close_stream(events)
        raise
    return relay_events(prepared, opening, events)


def close_stream(events: Iterator[Any]) -> None:
    close = getattr(events, "close", None)
    if close is not None:
        close()


@dataclass
class Relayed:
    """What a streamed answer has sent: its text (recorded when the stream ends well),
    its first chunk (the memories chunk takes its id), the upstream's ``[DONE]``."""

    text: list[str] = field(default_factory=list)
    first: dict[str, Any] | None = None
    done: bytes = DONE
    started: bool = False
    failed: bool = False
    # called once, as the first event goes to the client (the tool loop's learning: a
    # turn teaches once its answer has started, not when a round only called tools)
    on_start: Callable[[], None] | None = None

    def sent(self, event: SSEEvent, raw: bytes | None = None) -> bytes:
        """Note ``event`` as sent; answers its bytes (``raw``: as the proxy changed it)."""
        if not self.started and self.on_start is not None:
            self.on_start()
        self.started = True
        chunk = event.json()
        if isinstance(chunk, dict):
            self.first = self.first or chunk
            self.text.append(delta_text(chunk))
            self.failed = self.failed or "error" in chunk
        return event.raw if raw is None else raw

    def close(self, prepared: PreparedChat) -> Iterator[bytes]:
        if not self.failed:
            chat_record(prepared, "".join(self.text))
        if prepared.end_user is not None:
            yield sse(memories_chunk(prepared, self.first or {}))
        yield self.done


def relay_events(
    prepared: PreparedChat, opening: list[SSEEvent], rest: Iterator[SSEEvent]
) -> Iterator[bytes]:
    """The SSE answer from an upstream stream whose opening has arrived: each event's
    bytes as they came, ``[DONE]`` held back until the memories chunk has gone."""
    if not opening:
        return iter([DONE])

    def events() -> Iterator[bytes]:
        enqueue_formation(prepared)
        relayed = Relayed()
        try:
            try:
                for event in chain(opening, rest):
                    if event.done:
                        relayed.done = event.raw
                    else:
                        yield relayed.sent(event)
            except ProviderError as exc:
                relayed.failed = True
                yield error_event(exc)
            finally:  # also when the client goes away: the upstream's response is closed
                close_stream(rest)
            yield from relayed.close(prepared)
        finally:  # the answer started: the turn teaches, recorded or not
            formation_flush(prepared)

    return events()
