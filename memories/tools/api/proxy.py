"""The chat proxy with server-side memory tools (opt-in)."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request

from core.errors import InvalidInput
from memories.personal.api.openai_views import ChatCompletionsView


class MemoryToolsChatView(ChatCompletionsView):
    """``POST /v1/chat/completions``: the personal-memory proxy; ``memory_tools`` is this
    service's own request field and never goes upstream."""

    def _body(self, request: Request) -> dict[str, Any]:
        body = super()._body(request)
        opt_in = body.pop("memory_tools", None)
        if opt_in is not None and not isinstance(opt_in, bool):
            raise InvalidInput(
                "memory_tools: Must be a boolean.", details={"memory_tools": "boolean"}
            )
        return body
