"""The OpenAI-compatible proxy's doors: ``POST /v1/chat/completions`` (the end user's
facts injected, the server-side memory tools on request) and ``GET /v1/models``."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from django.http.request import RawPostDataException
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.errors import openai_exception_handler
from core.api.schema import OpenAIErrorSerializer
from core.errors import InvalidInput
from core.json_text import JsonText
from core.key_limits import end_user_check
from core.providers.errors import ProviderError, ProviderNotConfigured
from core.providers.llm import get_llm
from core.tracing import carry_iter
from core.validation import END_USER_ID, SESSION_ID, validate_end_user_id, validate_session_id
from memories.engine.owner_settings import memory_tools_enabled
from memories.proxy.api.serializers import (
    CHAT_ANSWER_SCHEMA,
    ChatCompletionSerializer,
    ModelListSerializer,
)
from memories.proxy.chat import (
    PreparedChat,
    chat_check,
    chat_complete,
    chat_prepare,
    chat_sender,
    chat_stream,
    unmade_on_failure,
)
from memories.proxy.tool_loop import loop_complete, loop_stream

logger = logging.getLogger(__name__)


def _header(request: Request, name: str) -> str:
    return str(request.headers.get(name) or "").strip()


# What both chat completion doors answer (the plain one and the one with memory tools).
COMPLETION_SCHEMA: dict[str, Any] = {
    "summary": "Chat completion with the end user's memories",
    "request": ChatCompletionSerializer,
    "responses": {
        (200, "application/json"): CHAT_ANSWER_SCHEMA,
        (200, "text/event-stream"): OpenApiTypes.STR,
        409: OpenAIErrorSerializer,  # (a chat id of another end user's chat)
        502: OpenAIErrorSerializer,
        504: OpenAIErrorSerializer,
    },
}


class ChatCompletionsView(APIView):
    """OpenAI-compatible ``POST /v1/chat/completions`` with per-user memories."""

    throttle_setting = "CHAT_THROTTLE_RATE"  # core.api.throttling

    def get_exception_handler(self):  # type: ignore[no-untyped-def]
        return openai_exception_handler

    def _external_id(self, request: Request, body: dict[str, Any]) -> str | None:
        """The end user: the user header's, else the body's ``user``; a bad one is a 400
        naming where it came from (the header was reported as a ``user`` field the
        request never sent)."""
        header = settings.MEMORY_USER_HEADER
        external_id = _header(request, header) or None
        if external_id is None:
            return validate_end_user_id(body["user"]) if body.get("user") else None
        if not END_USER_ID.matches(external_id):
            raise InvalidInput.at(header, END_USER_ID.message, code=END_USER_ID.code)
        return external_id

    def _chat_id(self, request: Request) -> str | None:
        """The chat id header, checked as a session id but named as the client sent it
        (a bad one is a 400 about the header, not about a session_id it never sent)."""
        header = settings.MEMORY_CHAT_HEADER
        chat_id = _header(request, header)
        if not chat_id:
            return None
        try:
            return validate_session_id(chat_id)
        except InvalidInput as exc:
            raise InvalidInput.at(header, SESSION_ID.message, code=exc.code) from None

    def _body(self, request: Request) -> JsonText:
        """The client's body, validated where the proxy relies on it; it goes upstream
        byte for byte as sent (``stream_options`` only with ``stream``)."""
        raw = _raw_body(request)  # before request.data: DRF's parser consumes the stream
        if not isinstance(request.data, dict):
            raise InvalidInput("The body must be a JSON object.")
        checked = ChatCompletionSerializer(data=request.data)
        checked.is_valid(raise_exception=True)
        body = _as_sent(raw, request.data)
        if not checked.validated_data["stream"] and "stream_options" in body.data:
            body = body.remove(("stream_options",))
        return body

    @extend_schema(
        **COMPLETION_SCHEMA,
        description="OpenAI's chat completion (the upstream's answer plus a memories "
        "array), or server-sent events with stream=true. Errors in OpenAI's shape.",
    )
    def post(self, request: Request) -> HttpResponse | StreamingHttpResponse:
        body = self._body(request)
        prepared = self.prepare(request, body)
        return self.answer(prepared)

    def prepare(self, request: Request, body: JsonText) -> PreparedChat:
        external_id = self._external_id(request, body.data)
        end_user_check(external_id)  # a key narrowed to a scope serves its end user only
        chat_id = self._chat_id(request)
        if not settings.LLM_BASE_URL:
            raise ProviderNotConfigured("LLM_BASE_URL", "The chat proxy")
        chat_check(owner_id=request.user.pk, chat_id=chat_id, external_id=external_id)
        common = {
            "owner_id": request.user.pk,
            "body": body,
            "chat_id": chat_id,
            "token": uuid.uuid4(),  # (the end user it makes: ``unmade_on_failure``)
            "user_name": _header(request, settings.MEMORY_USER_NAME_HEADER),
            "user_email": _header(request, settings.MEMORY_USER_EMAIL_HEADER),
        }
        try:
            return chat_prepare(external_id=external_id, **common)
        except ProviderError:
            # Retrieval needs the embedder; without it the answer still goes through
            # (its chat recorded as the end user's all the same).
            logger.exception("memory retrieval failed; answering without memories")
            prepared = chat_prepare(external_id=None, **common)
            prepared.chat_sender = chat_sender(external_id)
            prepared.external_id = external_id  # (made before it failed: unmade_on_failure)
            return prepared

    def answer(self, prepared: PreparedChat) -> HttpResponse | StreamingHttpResponse:
        with unmade_on_failure(prepared):
            if prepared.body.get("stream"):
                return event_stream(chat_stream(prepared))
            return json_answer(chat_complete(prepared))


def _raw_body(request: Request) -> bytes | None:
    try:
        return request._request.body
    except RawPostDataException:  # read as a stream already (a parser ran first)
        return None


def _as_sent(raw: bytes | None, data: dict[str, Any]) -> JsonText:
    """The body's own text when it is the JSON the parser read (else, say a form post
    or another charset, ``data`` written as JSON)."""
    try:
        sent = JsonText.parse(raw) if raw is not None else None
    except ValueError:
        sent = None
    return sent if sent is not None and isinstance(sent.data, dict) else JsonText.of(data)


def json_answer(content: bytes) -> HttpResponse:
    """A JSON answer's bytes as they are (no renderer encodes them again)."""
    return HttpResponse(content, content_type="application/json")


def event_stream(events: Any) -> StreamingHttpResponse:
    # Read after the view (and the request's span) returned: in the request's trace.
    response = StreamingHttpResponse(carry_iter(events), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


class ModelsView(APIView):
    """OpenAI-compatible ``GET /v1/models``: the upstream's list as it came; when the
    upstream lists none (or has no such endpoint), ``LLM_MODEL``."""

    def get_exception_handler(self):  # type: ignore[no-untyped-def]
        return openai_exception_handler

    @extend_schema(summary="The models the chat proxy offers", responses=ModelListSerializer)
    def get(self, request: Request) -> Response:
        if not settings.LLM_BASE_URL:
            raise ProviderNotConfigured("LLM_BASE_URL", "The chat proxy")
        try:
            listed = get_llm(feature="The chat proxy").models()
        except ProviderError as exc:  # no such endpoint, or down: clients still list ours
            logger.warning("the upstream lists no models (%s); answering LLM_MODEL", exc)
            listed = None
        if isinstance(listed, dict) and isinstance(listed.get("data"), list) and listed["data"]:
            return Response(listed)
        ids = [settings.LLM_MODEL] if settings.LLM_MODEL else []
        created = int(time.time())
        return Response(
            {
                "object": "list",
                "data": [
                    {"id": i, "object": "model", "created": created, "owned_by": "memory-service"}
                    for i in ids
                    if i
                ],
            }
        )


class MemoryToolsChatView(ChatCompletionsView):
    """The chat proxy; with ``"memory_tools": true`` in the request (or the owner's engine
    setting ``memory_tools`` on and the request not saying false) and an end user, the
    proxy also offers the model manage_memory/search_memory and runs them itself.
    ``memory_tools`` is this service's own field and never goes upstream."""

    def _opt_in(self, body: JsonText) -> tuple[bool | None, JsonText]:
        value = body.data.get("memory_tools")
        if value is not None and not isinstance(value, bool):
            raise InvalidInput.at("memory_tools", "Must be a boolean.")
        return value, body.remove(("memory_tools",)) if "memory_tools" in body.data else body

    @extend_schema(
        **COMPLETION_SCHEMA,
        description="OpenAI's chat completion (the upstream's answer plus a memories "
        "array), or server-sent events with stream=true; with memory_tools: true the proxy "
        "also offers the model manage_memory and search_memory and runs them. Errors in "
        "OpenAI's shape.",
    )
    def post(self, request: Request) -> HttpResponse | StreamingHttpResponse:
        opt_in, body = self._opt_in(self._body(request))
        external_id = self._external_id(request, body.data)
        if opt_in and not external_id:
            said = "needs an end user: send the X-OpenWebUI-User-Id header or the user field"
            raise InvalidInput.at("memory_tools", said)
        runs = bool(external_id) and (
            opt_in if opt_in is not None else memory_tools_enabled(owner=request.user.pk)
        )
        if runs and body.data.get("tools") is not None and not isinstance(body.data["tools"], list):
            # (the memory tools are offered beside the client's: "tools": "x" was replaced)
            said = "must be a list of tools; the memory tools are offered beside them"
            raise InvalidInput.at("tools", said)
        prepared = self.prepare(request, body)
        if prepared.end_user is None or not runs:
            return self.answer(prepared)
        with unmade_on_failure(prepared):
            if prepared.body.get("stream"):
                return event_stream(loop_stream(prepared))
            return json_answer(loop_complete(prepared))
