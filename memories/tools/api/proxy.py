"""``POST /v1/chat/completions`` with the opt-in server-side memory tools."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request

from core.errors import InvalidInput
from core.json_text import JsonText
from memories.personal.api.openai_views import ChatCompletionsView, event_stream, json_answer
from memories.personal.api.serializers import ChatCompletionSerializer
from memories.tools.chat_loop import loop_complete, loop_stream


class MemoryToolsChatView(ChatCompletionsView):
    """The personal-memory proxy; with ``"memory_tools": true`` in the request (or
    ``CHAT_MEMORY_TOOLS`` on and the request not saying false) and an end user, the
    proxy also offers the model manage_memory/search_memory and runs them itself.
    ``memory_tools`` is this service's own field and never goes upstream."""

    def _opt_in(self, body: JsonText) -> tuple[bool | None, JsonText]:
        value = body.data.get("memory_tools")
        if value is not None and not isinstance(value, bool):
            raise InvalidInput(
                "memory_tools: Must be a boolean.", details={"memory_tools": "boolean"}
            )
        return value, body.remove(("memory_tools",)) if "memory_tools" in body.data else body

    @extend_schema(request=ChatCompletionSerializer, responses={200: dict})
    def post(self, request: Request) -> HttpResponse | StreamingHttpResponse:
        opt_in, body = self._opt_in(self._body(request))
        if opt_in and not self._external_id(request, body.data):
            raise InvalidInput(
                "memory_tools needs an end user: send the X-OpenWebUI-User-Id header or the "
                "user field",
                details={"memory_tools": "no end user"},
            )
        prepared = self.prepare(request, body)
        wanted = settings.CHAT_MEMORY_TOOLS if opt_in is None else opt_in
        if not wanted or prepared.end_user is None:
            return self.answer(prepared)
        if prepared.body.get("stream"):
            return event_stream(loop_stream(prepared))
        return json_answer(loop_complete(prepared))
