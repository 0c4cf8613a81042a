"""The OpenAI-compatible chat proxy: retrieve memories, inject them, forward, learn.

Anonymous requests (no end-user id) take the same answer path without retrieval
or formation. Formation is queued only once the upstream answer has started (the
JSON answer arrived, or the first streamed chunk), after the request's
transaction commits, so a failed request never writes a memory.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from django.conf import settings
from django.utils import timezone

from core.providers.embeddings import get_embedder
from core.providers.errors import ProviderError
from core.providers.llm import get_llm
from core.providers.tokens import count_tokens
from core.queue import enqueue_on_commit
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
    memories: list[MemoryHit] = field(default_factory=list)
    end_user: EndUser | None = None
    user_text: str = ""
    received_at: datetime = field(default_factory=timezone.now)


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


def chat_prepare(*, owner_id: int, body: dict[str, Any], external_id: str | None) -> PreparedChat:
    """Resolve the end user, retrieve their memories and build the upstream request."""
    prepared = PreparedChat(body=dict(body))
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


def _enqueue_formation(prepared: PreparedChat) -> None:
    """Learning is best effort: the answer is delivered whether or not this queues."""
    if prepared.end_user is None or not prepared.user_text.strip():
        return
    enqueue_on_commit(
        "ingestion.tasks.form_memories",
        prepared.end_user.owner_id,
        prepared.end_user.external_id,
        prepared.user_text,
        prepared.received_at.isoformat(),
        task_name="form-memories",
    )


def chat_complete(prepared: PreparedChat) -> dict[str, Any]:
    """Forward once; the upstream JSON comes back unchanged plus a ``memories`` array."""
    answer = get_llm(feature="The chat proxy").create(**prepared.body)
    _enqueue_formation(prepared)
    return {**answer, "memories": memories_payload(prepared)}


def chat_stream(prepared: PreparedChat) -> Iterator[bytes]:
    """Server-sent events relayed from upstream. Errors before the first chunk raise
    (the caller answers with a JSON error); later ones end the stream with an error event."""
    stream = get_llm(feature="The chat proxy").stream(**prepared.body)
    first = next(stream, None)  # raises ProviderError before anything is sent

    def events() -> Iterator[bytes]:
        if first is None:
            yield b"data: [DONE]\n\n"
            return
        _enqueue_formation(prepared)
        yield f"data: {json.dumps(first)}\n\n".encode()
        try:
            for chunk in stream:
                yield f"data: {json.dumps(chunk)}\n\n".encode()
        except ProviderError as exc:
            error = {
                "error": {"message": str(exc), "type": "upstream_error", "code": exc.status_code}
            }
            yield f"data: {json.dumps(error)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return events()
