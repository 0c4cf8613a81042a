"""The chat LLM: any OpenAI-compatible endpoint through the ``openai`` package.

With ``LLM_BASE_URL`` unset, ``get_llm()`` raises ``ProviderNotConfigured`` naming
the variable, and the API turns that into a JSON 503; features that need no LLM
keep working.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from core.json_text import JsonText
from core.providers.errors import ProviderBadResponse, ProviderNotConfigured
from core.providers.relay import ChatRelay, SSEEvent
from core.providers.retry import call_with_retries, translate_error
from core.tracing import llm_span, llm_span_open, note_answer, span_end, within
from core.usage import Attribution, attribution, record_chat, usage_as


@dataclass
class ChatResult:
    content: str
    model: str
    usage: dict[str, int] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = ""  # "length": cut off at the token limit
    refusal: str = ""  # a structured-output refusal (OpenAI's message.refusal)


class ChatLLM:
    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float,
        max_retries: int,
        backoff: float,
    ):
        self.model = model
        self.base_url = base_url
        self.max_retries = max_retries
        self.backoff = backoff
        import openai  # here, not at import: half a second every process would pay

        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout, max_retries=0
        )
        self.relayer = ChatRelay(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries,
            backoff=backoff,
        )  # fmt: skip

    def create(self, **kwargs: Any) -> dict[str, Any]:
        """One non-streaming chat completion; returns the upstream JSON as a dict. Its
        tokens are counted for the work it does (``core.usage``)."""
        kwargs.setdefault("model", self.model)
        kwargs.pop("stream", None)
        with llm_span(kwargs["model"], kwargs.get("messages")):
            response = call_with_retries(
                lambda: self.client.chat.completions.create(**kwargs),
                max_retries=self.max_retries,
                backoff=self.backoff,
            )
            raw = response.model_dump(exclude_unset=True)
            _count(kwargs["model"], raw, kwargs.get("messages"))
            note_answer(_answer_text(raw))
        return raw

    def complete(self, messages: list[dict[str, Any]], **kwargs: Any) -> ChatResult:
        raw = self.create(messages=messages, **kwargs)
        try:
            choice = raw["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ProviderBadResponse(f"chat response has no message content: {exc}") from exc
        return ChatResult(
            content=content, model=raw.get("model", ""), usage=raw.get("usage") or {}, raw=raw,
            finish_reason=str(choice.get("finish_reason") or ""),
            refusal=str(message.get("refusal") or ""),
        )  # fmt: skip

    def stream(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Stream chunks as dicts. Retries happen only before the first chunk arrives."""
        kwargs.setdefault("model", self.model)
        kwargs["stream"] = True
        import openai

        span = llm_span_open(kwargs["model"], kwargs.get("messages"))
        failed: Exception | None = None
        seen = _Streamed()
        try:
            with within(span):
                stream = call_with_retries(
                    lambda: self.client.chat.completions.create(**kwargs),
                    max_retries=self.max_retries,
                    backoff=self.backoff,
                )
            for chunk in stream:
                data = chunk.model_dump(exclude_unset=True)
                seen.add(data)
                yield data
        except Exception as exc:
            failed = exc
            if isinstance(exc, openai.OpenAIError):
                raise translate_error(exc) from exc
            raise
        finally:
            with within(span):
                seen.count(kwargs["model"], kwargs.get("messages"))
                note_answer("".join(seen.text))
            span_end(span, failed)

    # --- the chat proxy: bodies relayed as bytes, not rebuilt through the typed client ---
    def relay(self, content: bytes) -> JsonText:
        """POST the request body ``content`` to ``/chat/completions`` as it is (every
        field the client sent, ``tools``, ``tool_choice`` and vendor fields included) and
        return the upstream's JSON answer as it came, byte for byte."""
        with llm_span(self.model, _content_messages(content)):
            answer = self.relayer.complete(content)
            data = answer.data if isinstance(answer.data, dict) else {}
            _count(self.model, data, None, request=content)
            note_answer(_answer_text(data))
        return answer

    def relay_stream(self, content: bytes, usage: Attribution | None = None) -> Iterator[SSEEvent]:
        """The same, streamed (``content`` has ``"stream": true``): the upstream's
        server-sent events as they came. Retries happen only before the first byte.
        Its tokens are counted when it ends or is closed, for ``usage`` (default: the work
        current now: a stream is read after the code that asked for it has returned);
        callers close what they do not read to the end, so the count is never written
        from a finaliser."""
        span = llm_span_open(self.model, _content_messages(content))
        try:
            with within(span):
                events = self.relayer.stream(content)  # (raises here, before the first byte)
        except Exception as exc:
            span_end(span, exc)
            raise
        return self._counted(events, content, usage or attribution(), span)

    def _counted(self, events: Iterator[SSEEvent], content: bytes,
                 who: Attribution | None, span: Any) -> Iterator[SSEEvent]:  # fmt: skip
        seen = _Streamed()
        try:
            for event in events:
                data = event.json()
                if isinstance(data, dict):
                    seen.add(data)
                yield event
        finally:
            # Closing this closes the upstream's response at once (the caller closes it
            # when the client goes away or the opening was an error), not at collection.
            close = getattr(events, "close", None)
            if close is not None:
                close()
            with usage_as(who), within(span):
                seen.count(self.model, None, request=content)
                note_answer("".join(seen.text))
            span_end(span)

    def models(self) -> Any:
        """The upstream's ``GET /models`` JSON (one try: callers have a fallback)."""
        return call_with_retries(
            lambda: self.client.get("/models", cast_to=object), max_retries=0, backoff=0
        )


def _content_messages(content: bytes) -> Any:
    """The relayed request's messages, for its span when content is traced (else None:
    the body is not read again)."""
    return _request_messages(content) if settings.TRACE_MESSAGE_CONTENT else None


def _answer_text(raw: dict[str, Any]) -> str:
    if not settings.TRACE_MESSAGE_CONTENT:
        return ""
    choices = raw.get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else {}
    return str((message or {}).get("content") or "")


def _request_messages(request: bytes | None) -> Any:
    try:
        return json.loads(request or b"{}").get("messages")
    except (ValueError, AttributeError):
        return None


def _count(model: str, raw: dict[str, Any], messages: Any, request: bytes | None = None) -> None:
    """Record a non-streamed answer's usage (its ``usage``, or counted)."""
    usage = raw.get("usage")
    text = ""
    if not (isinstance(usage, dict) and usage.get("prompt_tokens") is not None):
        messages = messages if messages is not None else _request_messages(request)
        choices = raw.get("choices") or []
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else {}
        text = str((message or {}).get("content") or "")
    record_chat(str(raw.get("model") or model), usage, messages, text)


@dataclass
class _Streamed:
    """A streamed answer's text and usage (a final chunk's, when the caller asked for
    ``stream_options.include_usage``), as its chunks pass."""

    text: list[str] = field(default_factory=list)
    usage: Any = None
    model: str = ""

    def add(self, chunk: dict[str, Any]) -> None:
        self.model = self.model or str(chunk.get("model") or "")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and delta.get("content"):
                self.text.append(str(delta["content"]))

    def count(self, model: str, messages: Any, request: bytes | None = None) -> None:
        if messages is None and not self.usage:
            messages = _request_messages(request)
        record_chat(self.model or model, self.usage, messages, "".join(self.text))


def llm_configured() -> bool:
    return bool(settings.LLM_BASE_URL)


_clients: dict[tuple[Any, ...], ChatLLM] = {}
_lock = threading.Lock()


def get_llm(*, feature: str = "This feature") -> ChatLLM:
    """The configured chat LLM. One client per configuration and process: building an
    HTTP client (connection pool, TLS context) per request costs tens of milliseconds."""
    if not settings.LLM_BASE_URL:
        raise ProviderNotConfigured("LLM_BASE_URL", feature)
    if not settings.LLM_MODEL:
        raise ProviderNotConfigured("LLM_MODEL", feature)
    config = (
        settings.LLM_BASE_URL,
        settings.LLM_API_KEY,
        settings.LLM_MODEL,
        settings.LLM_TIMEOUT,
        settings.LLM_MAX_RETRIES,
        settings.RETRY_BACKOFF_SECONDS,
    )
    with _lock:
        if config not in _clients:
            _clients[config] = ChatLLM(
                base_url=config[0],
                api_key=config[1],
                model=config[2],
                timeout=config[3],
                max_retries=config[4],
                backoff=config[5],
            )
        return _clients[config]
