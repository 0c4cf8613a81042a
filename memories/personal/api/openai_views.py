from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.errors import openai_exception_handler
from core.api.schema import OpenAIErrorSerializer
from core.errors import InvalidInput
from core.providers.errors import ProviderError, ProviderNotConfigured
from core.validation import validate_end_user_id
from memories.personal.api.serializers import ChatCompletionSerializer
from memories.personal.chat import PreparedChat, chat_complete, chat_prepare, chat_stream

logger = logging.getLogger(__name__)


class ChatCompletionsView(APIView):
    """OpenAI-compatible ``POST /v1/chat/completions`` with per-user memories."""

    throttle_setting = "CHAT_THROTTLE_RATE"  # core.api.throttling

    def get_exception_handler(self):  # type: ignore[no-untyped-def]
        return openai_exception_handler

    def _external_id(self, request: Request, body: dict[str, Any]) -> str | None:
        header = "HTTP_" + settings.MEMORY_USER_HEADER.upper().replace("-", "_")
        external_id = request.META.get(header) or body.get("user") or None
        if external_id is None:
            return None
        return validate_end_user_id(external_id)

    @extend_schema(
        summary="Chat completion with the end user's memories",
        request=ChatCompletionSerializer,
        responses={
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "text/event-stream"): OpenApiTypes.STR,
            502: OpenAIErrorSerializer,
            504: OpenAIErrorSerializer,
        },
        description="OpenAI's chat completion (the upstream's answer plus a memories "
        "array), or server-sent events with stream=true. Errors in OpenAI's shape.",
    )
    def post(self, request: Request) -> Response | StreamingHttpResponse:
        if not isinstance(request.data, dict):
            raise InvalidInput("The body must be a JSON object.")
        checked = ChatCompletionSerializer(data=request.data)
        checked.is_valid(raise_exception=True)
        body = dict(request.data)
        body.pop("stream", None)
        stream: bool = checked.validated_data["stream"]
        body.pop("stream_options", None) if not stream else None
        external_id = self._external_id(request, body)
        if not settings.LLM_BASE_URL:
            raise ProviderNotConfigured("LLM_BASE_URL", "The chat proxy")
        prepared = self._prepare(request, body, external_id)
        if stream:
            response = StreamingHttpResponse(
                chat_stream(prepared), content_type="text/event-stream"
            )
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
            return response
        return Response(chat_complete(prepared))

    def _prepare(
        self, request: Request, body: dict[str, Any], external_id: str | None
    ) -> PreparedChat:
        try:
            return chat_prepare(owner_id=request.user.pk, body=body, external_id=external_id)
        except ProviderError:
            # Retrieval needs the embedder; without it the answer still goes through.
            logger.exception("memory retrieval failed; answering without memories")
            prepared = chat_prepare(owner_id=request.user.pk, body=body, external_id=None)
            return prepared
