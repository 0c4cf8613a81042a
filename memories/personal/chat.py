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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.providers.embeddings import get_embedder
from core.providers.errors import ProviderError
from core.providers.llm import get_llm
from core.providers.tokens import count_tokens
from core.queue import enqueue_on_commit
from memories.conversations.services import MessageIn, flow_ensure, messages_store
from memories.personal.models import EndUser
from memories.personal.retrieval import format_for_injection
from memories.personal.selectors import FactRow, MemoryHit, memory_search, personal_count
from memories.personal.services import end_user_ensure

logger = logging.getLogger(__name__)

MEMORY_BLOCK_HEADER = (
    "Long-term memories about the user, from earlier conversations. They may or may not be "
    "relevant: use the ones that help answer the current message and ignore the rest. "
    "Do not mention this list unless asked."
)


@dataclass
class PreparedChat:
    body: dict[str, Any]
    owner_id: int = 0
    memories: list[MemoryHit] = field(default_factory=list)
    end_user: EndUser | None = None
    user_text: str = ""
    received_at: datetime = field(default_factory=timezone.now)
    # Open WebUI's forwarded headers: the chat becomes a conversation (history, summaries)
    chat_id: str | None = None
    user_name: str = ""
    user_email: str = ""
    # extra fields reported beside ``memories`` (the server-side memory tools' calls)
    report: dict[str, Any] = field(default_factory=dict)
    # the turn teaches, and waits for chat_record to name the recorded message
    formation_pending: bool = False


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


def inject(messages: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """Append the block to the first system message, or add one in front."""
    if not block:
        return messages
    out = [dict(m) for m in messages]
    for message in out:
        if message.get("role") in ("system", "developer") and isinstance(
            message.get("content"), str
        ):
            message["content"] = f"{message['content']}\n\n{block}"
            return out
    return [{"role": "system", "content": block}, *out]


def chat_prepare(
    *,
    owner_id: int,
    body: dict[str, Any],
    external_id: str | None,
    chat_id: str | None = None,
    user_name: str = "",
    user_email: str = "",
) -> PreparedChat:
    """Resolve the end user, retrieve their memories and build the upstream request:
    ``body`` as the client sent it, the memory block added to the system prompt."""
    prepared = PreparedChat(
        body=dict(body), owner_id=owner_id, chat_id=chat_id, user_name=user_name,
        user_email=user_email,
    )  # fmt: skip
    prepared.body.setdefault("model", settings.LLM_MODEL)
    users = [m for m in body["messages"] if m.get("role") == "user"]
    prepared.user_text = message_text(users[-1].get("content")) if users else ""
    if not external_id:
        return prepared
    prepared.end_user = end_user_ensure(owner=owner_id, external_id=external_id)
    if not prepared.user_text.strip():
        return prepared
    block, prepared.memories = memory_block(
        owner_id=owner_id, end_user=prepared.end_user, query=prepared.user_text
    )
    prepared.body["messages"] = inject(body["messages"], block)
    return prepared


def memory_block(*, owner_id: int, end_user: EndUser, query: str) -> tuple[str, list[MemoryHit]]:
    """The system-prompt block within ``MEMORY_PROMPT_MAX_TOKENS``: the user's core facts
    as the engine injects them (``format_for_injection``: corrections' share, then the
    facts relevant to ``query``, then the rest by confidence). Relevant is what the
    hybrid ranking keeps (``memory_search``: cosine fused with BM25 when
    ``MEMORY_HYBRID``, ``MEMORY_SCORE_THRESHOLD`` on the similarity,
    ``MEMORY_RELATIVE_THRESHOLD`` of the best score); for a user with few memories the
    relevant global memories follow while they fit. An embedder failure leaves the
    ranking keyword-only, never the answer."""
    embedder = get_embedder()
    try:
        vector: list[float] | None = [float(x) for x in embedder.embed([query])[0]]
    except Exception:  # the answer does not depend on memories
        logger.warning("chat proxy: the embedder failed; memories ranked by keyword", exc_info=True)
        vector = None
    budget = settings.MEMORY_PROMPT_MAX_TOKENS
    cold = personal_count(end_user=end_user) < settings.MEMORY_GLOBAL_MIN_PERSONAL
    found: list[MemoryHit] = []
    if vector is not None:
        found = memory_search(
            owner_id=owner_id,
            end_user=end_user,
            vector=vector,
            embedding_model=embedder.model,
            top_k=settings.MEMORY_TOP_K,
            threshold=settings.MEMORY_SCORE_THRESHOLD,
            include_globals=cold,
            query=query if settings.MEMORY_HYBRID else None,
            relative_threshold=settings.MEMORY_RELATIVE_THRESHOLD or None,
        )
    personal = [(h.id, h.similarity) for h in found if h.type != "global"]
    injection = format_for_injection(
        owner=owner_id,
        scope=end_user,
        max_tokens=budget,
        query=query,
        header=MEMORY_BLOCK_HEADER,
        embedder=embedder if vector is not None else _Failed(),
        ranked=personal if vector is not None else None,
    )
    hits = [_hit(f, injection.similarity.get(f.pk)) for f in injection.facts]
    text, added = _append_globals(injection.text, [h for h in found if h.type == "global"], budget)
    return text, hits + added


class _Failed:
    """An embedder that already failed for this request: search goes keyword-only."""

    provider, model, dimensions = "failed", "", 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("the embedder failed for this request")


def _hit(fact: FactRow, similarity: float | None) -> MemoryHit:
    return MemoryHit(
        id=fact.pk, content=fact.content, type=fact.type, created_at=fact.created_at,
        observed_at=fact.observed_at, similarity=similarity if similarity is not None else 0.0,
        score=similarity if similarity is not None else 0.0, relevant=similarity is not None,
    )  # fmt: skip


def _append_globals(
    text: str, globals_: list[MemoryHit], budget: int
) -> tuple[str, list[MemoryHit]]:
    lines = text.splitlines() if text else [MEMORY_BLOCK_HEADER]
    kept: list[MemoryHit] = []
    for hit in globals_:
        candidate = [*lines, f"- [global] {hit.content}"]
        if count_tokens("\n".join(candidate)) > budget:
            break
        lines = candidate
        kept.append(hit)
    return ("\n".join(lines) if len(lines) > 1 else ""), kept


def memories_payload(prepared: PreparedChat) -> list[dict[str, Any]]:
    return [
        {
            "id": str(h.id),
            "content": h.content,
            "type": h.type,
            "relevant": h.relevant,
            "score": round(h.similarity, 4) if h.relevant else None,
        }  # fmt: skip
        for h in prepared.memories
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
        task_name="form-memories",
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
    """With a chat id (Open WebUI's ``X-OpenWebUI-Chat-Id``): the user's message and the
    answer join the conversation ``chat_id`` of the owner's ``CHAT_PROXY_FLOW`` flow, so
    ``/api/v1/conversations/{chat_id}/history`` and the engine's summaries read it. Only
    a turn that ends with a user message is recorded (a tool result sent back is the
    same turn going on), once its answer has arrived; then the learning the turn waits
    for is queued with the recorded user message's id."""
    if not prepared.chat_id or not _user_turn(prepared):
        return
    sender = prepared.end_user.external_id if prepared.end_user is not None else ""
    name = prepared.user_name
    if prepared.user_email:
        name = f"{name} <{prepared.user_email}>".strip()
    name = name[:200]
    with transaction.atomic():
        flow = flow_ensure(owner_id=prepared.owner_id, name=settings.CHAT_PROXY_FLOW)
        stored = messages_store(
            flow=flow, session_id=prepared.chat_id, run_id=f"chat-{uuid.uuid4().hex}",
            messages=[
                MessageIn(role="user", text=prepared.user_text, sender=(sender or "user")[:100],
                          sender_name=name),
                MessageIn(role="assistant", text=text),
            ],
        )  # fmt: skip
    if prepared.formation_pending:
        _queue_formation(prepared, str(stored[0].pk))


def chat_complete(prepared: PreparedChat) -> dict[str, Any]:
    """Forward once; the upstream JSON comes back unchanged plus a ``memories`` array."""
    answer = get_llm(feature="The chat proxy").relay(prepared.body)
    enqueue_formation(prepared)
    chat_record(prepared, answer_text(answer))
    return {**answer, "memories": memories_payload(prepared), **prepared.report}


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
    return f"data: {json.dumps(data)}\n\n".encode()


def chat_stream(prepared: PreparedChat) -> Iterator[bytes]:
    """Server-sent events relayed from upstream, each chunk's JSON as it came. Errors
    before the first chunk raise (the caller answers with a JSON error); later ones end
    the stream with an error event. With a user, a last chunk carries ``memories``."""
    stream = get_llm(feature="The chat proxy").relay_stream(prepared.body)
    first = next(stream, None)  # raises ProviderError before anything is sent
    return relay_events(prepared, first, stream)


def relay_events(
    prepared: PreparedChat, first: dict[str, Any] | None, rest: Iterator[dict[str, Any]]
) -> Iterator[bytes]:
    """The SSE answer from an upstream stream whose first chunk has arrived."""
    if first is None:
        return iter([b"data: [DONE]\n\n"])

    def events() -> Iterator[bytes]:
        enqueue_formation(prepared)
        try:
            yield sse(first)
            parts = [delta_text(first)]
            try:
                for chunk in rest:
                    parts.append(delta_text(chunk))
                    yield sse(chunk)
            except ProviderError as exc:
                error = {
                    "error": {
                        "message": str(exc),
                        "type": "upstream_error",
                        "code": exc.status_code,
                    }
                }
                yield sse(error)
            else:
                chat_record(prepared, "".join(parts))
            if prepared.end_user is not None:
                yield sse(memories_chunk(prepared, first))
            yield b"data: [DONE]\n\n"
        finally:  # the answer started: the turn teaches, recorded or not
            formation_flush(prepared)

    return events()
