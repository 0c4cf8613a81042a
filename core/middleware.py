from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import TooManyFieldsSent
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from core import audit, tenancy
from core.api.errors import API_PREFIXES, api_error_response, json_400, validation_message
from core.api.parsers import UnstorableInput, check_parsed


class RequestSizeLimitMiddleware:
    """Refuse oversized API bodies with a JSON 413 before anything reads them (a chunked
    one, which has no length, read up to the limit)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIXES):
            chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
            if chunked and not request.META.get("CONTENT_LENGTH") and not _read_whole(request):
                return _too_large(request, None)
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return api_error_response(request, 400, "Invalid Content-Length header.")
            if length > settings.MAX_REQUEST_BYTES:
                return _too_large(request, length)
        return self.get_response(request)


def _too_large(request: HttpRequest, length: int | None) -> HttpResponse:
    limit = settings.MAX_REQUEST_BYTES
    size = "Request body" if length is None else f"Request body of {length} bytes"
    message = f"{size} exceeds the limit of {limit} bytes."
    return api_error_response(request, 413, message, {"limit": limit, "size": length})


def _read_whole(request: HttpRequest) -> bool:
    """A chunked body (no Content-Length; the server de-chunks it) read up to the limit
    and given to the request with its length, as any (Django reads no body without one:
    the request ran as if empty, a 400 about missing fields, an import of an empty
    file). False past the limit, the rest unread."""
    stream = request.META.get("wsgi.input")
    if stream is None:  # (not WSGI: nothing to read here)
        return True
    raw = stream.read(settings.MAX_REQUEST_BYTES + 1)
    if len(raw) > settings.MAX_REQUEST_BYTES:
        return False
    request.META.pop("HTTP_TRANSFER_ENCODING", None)
    request.META["wsgi.input"], request.META["CONTENT_LENGTH"] = io.BytesIO(raw), str(len(raw))
    request._stream = LimitedStream(request.META["wsgi.input"], len(raw))  # type: ignore[assignment]
    return True


class QueryInputMiddleware:
    """The URL's path and query parameters get the checks request bodies get
    (``core.api.parsers.check_parsed``: no NUL, no lone surrogate), and too many query
    parameters answer JSON: once here for every API view."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIXES):
            try:
                check_parsed({"path": request.path})
                check_parsed(request.GET)
            except TooManyFieldsSent as exc:
                return json_400(request, exc)
            except UnstorableInput as exc:
                return api_error_response(
                    request, 400, validation_message(exc.detail), exc.detail, code="invalid"
                )
        return self.get_response(request)


class AccessActorMiddleware:
    """The request is who acts while it is served (``core.audit``): an erasure or a key
    created in it is recorded with its key or user and its client's address."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = audit.request_begin(request)
        try:
            return self.get_response(request)
        finally:
            audit.request_end(token)


class RowOwnerMiddleware:
    """Whose rows a request may touch (``core.tenancy``): it starts as nobody; the API's
    authentication names the key's (or signed-in user's) owner; the admin, for staff,
    works across owners through a bypass named after the staff user. A streamed body,
    produced after this returns, is produced under what the request ran as. Whatever
    the request set ends with it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self.admin_prefix = reverse("admin:index")

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = tenancy.enter(tenancy.NOBODY)
        try:
            if request.path.startswith(self.admin_prefix):
                user = request.user
                if user.is_active and user.is_staff:
                    tenancy.enter_bypass(f"admin:{user.get_username()}")
            response = self.get_response(request)
            if response.streaming:
                streamed: Any = response
                state = tenancy.state()
                carry = tenancy.carried_async if streamed.is_async else tenancy.carried
                # Its closers too (the body's own close, which Django registered with the
                # body and runs when the client goes away before the end): as the owner,
                # or what they write (the proxy counts the upstream call's usage) is
                # refused by row-level security.
                closers = list(streamed._resource_closers)
                streamed._resource_closers.clear()
                streamed.streaming_content = carry(streamed.streaming_content, state)
                streamed._resource_closers[:0] = [tenancy.bound(c) for c in closers]
            return response
        finally:
            tenancy.leave(token)
