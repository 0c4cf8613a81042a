from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from core.api.errors import json_error_response

API_PREFIXES = ("/api/", "/v1/")


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
                return json_error_response(
                    413,
                    f"Request body of {length} bytes exceeds the limit of "
                    f"{settings.MAX_REQUEST_BYTES} bytes.",
                    {"limit": settings.MAX_REQUEST_BYTES, "size": length},
                )
        return self.get_response(request)
