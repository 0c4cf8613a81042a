from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.api.errors import json_error_response, openai_error_body

API_PREFIXES = ("/api/", "/v1/", "/mcp")


class RequestSizeLimitMiddleware:
    """Refuse oversized API bodies with a JSON 413 before anything reads them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIXES):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return json_error_response(400, "Invalid Content-Length header.")
            if length > settings.MAX_REQUEST_BYTES:
                message = (
                    f"Request body of {length} bytes exceeds the limit of "
                    f"{settings.MAX_REQUEST_BYTES} bytes."
                )
                details = {"limit": settings.MAX_REQUEST_BYTES, "size": length}
                if request.path.startswith("/v1/"):
                    body = openai_error_body(413, "payload_too_large", message, details)
                    return JsonResponse(body, status=413)
                return json_error_response(413, message, details)
        return self.get_response(request)
