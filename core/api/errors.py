"""One JSON error shape for the whole API: ``{"error": {"code", "message", "details"}}``.

Services raise the ``core.errors.ServiceError`` family (provider errors included);
this handler maps them, a missing object (``ObjectDoesNotExist``, ``Http404``) and
DRF's own errors once. Views never catch and re-raise.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import (
    ObjectDoesNotExist,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from core.db_recovery import (
    as_database_unavailable,
    as_statement_timeout,
    response_for_current_exception,
)
from core.errors import ServiceError


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


_CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "throttled",
    503: "service_unavailable",
}


def _message(detail: Any, fallback: str) -> str:
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail and isinstance(detail[0], str):
        return detail[0]
    return fallback


def first_problem(detail: Any, path: str = "") -> tuple[str, str]:
    """The first error in DRF's nested validation details, as (the field's path, e.g.
    ``messages[1].content``, and its message as plain text)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key == "non_field_errors":
                inner = path
            elif isinstance(key, int) or str(key).isdigit():
                inner = f"{path}[{key}]"
            else:
                inner = f"{path}.{key}" if path else str(key)
            found = first_problem(value, inner)
            if found[1]:
                return found
        return path, ""
    if isinstance(detail, list):
        for index, value in enumerate(detail):
            found = first_problem(value, path if isinstance(value, str) else f"{path}[{index}]")
            if found[1]:
                return found
        return path, ""
    return path, str(detail)


def validation_message(detail: Any) -> str:
    """A plain sentence naming the (first) field at fault: ``content: Required.``"""
    path, message = first_problem(detail)
    if not message:
        return "The request is invalid."
    return f"{path}: {message}" if path else message


def field_messages(details: Any) -> Any:
    """A 400's ``details`` in one shape, DRF's: each field's messages as a list (a
    service names a field's problem as one string: it becomes a list of one). Other
    values (counts, ids, nested objects) are kept as they are."""
    if isinstance(details, dict):
        return {k: [v] if isinstance(v, str) else v for k, v in details.items()}
    return details


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    unavailable = as_database_unavailable(exc) or as_statement_timeout(exc)
    if unavailable is not None:  # an outage (503 with Retry-After), or a statement too long
        exc = unavailable
    if isinstance(exc, ServiceError):
        set_rollback()
        details = field_messages(exc.details) if exc.status_code == 400 else exc.details
        answer = Response(error_body(exc.code, str(exc), details), status=exc.status_code)
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            answer["Retry-After"] = str(retry_after)
        return answer
    if isinstance(exc, Http404 | ObjectDoesNotExist):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    status_code = response.status_code
    if isinstance(exc, exceptions.ValidationError):
        body = error_body("invalid", validation_message(exc.detail), exc.detail)
    else:
        detail = getattr(exc, "detail", None)
        code = _CODES.get(status_code, "error")
        if isinstance(exc, exceptions.APIException) and status_code not in (401, 403, 404):
            code = str(getattr(exc, "default_code", code))
        body = error_body(code, _message(detail, str(exc)), None)
    response.data = body
    return response


def json_error_response(
    status_code: int, message: str, details: Any = None, *, code: str | None = None
) -> JsonResponse:
    return JsonResponse(
        error_body(code or _CODES.get(status_code, "error"), message, details), status=status_code
    )


API_PREFIXES = ("/api/", "/v1/", "/mcp")  # /mcp: the MCP server's HTTP door


def api_error_response(
    request: HttpRequest,
    status_code: int,
    message: str,
    details: Any = None,
    *,
    code: str | None = None,
) -> JsonResponse:
    """An error outside DRF's views (middleware, Django's handlers) in the shape of the
    path: OpenAI's under ``/v1/``, the project's elsewhere."""
    code = code or _CODES.get(status_code, "error")
    if request.path.startswith("/v1/"):
        body = openai_error_body(status_code, code, message, details)
        return JsonResponse(body, status=status_code)
    return json_error_response(status_code, message, details, code=code)


def json_400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's own 400s (too many fields or query parameters, a body over
    DATA_UPLOAD_MAX_MEMORY_SIZE, a bad Host header) in JSON for API paths."""
    if not request.path.startswith(API_PREFIXES):
        return defaults.bad_request(request, exception or SuspiciousOperation())
    if isinstance(exception, RequestDataTooBig):
        return api_error_response(request, 413, "The request body is too large.")
    if isinstance(exception, TooManyFieldsSent | TooManyFilesSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return api_error_response(
            request,
            400,
            f"Too many fields or query parameters (at most {limit}).",
            {"limit": limit},
            code="too_many_fields",
        )
    return api_error_response(request, 400, "Bad request.")


def json_404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return api_error_response(request, 404, "Not found.")
    return defaults.page_not_found(request, exception or Http404())


def json_500(request: HttpRequest) -> HttpResponse:
    unavailable = response_for_current_exception(request)
    if unavailable is not None:  # every path: the admin cannot render without it either
        return unavailable
    if request.path.startswith(API_PREFIXES):
        return api_error_response(request, 500, "Internal server error.", code="server_error")
    return defaults.server_error(request)


_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}


def openai_error_body(
    status_code: int, code: str, message: str, details: Any = None
) -> dict[str, Any]:
    """OpenAI's error shape (message, type, param, code), plus our ``details``."""
    if status_code >= 500:
        kind = "api_error"
    else:
        kind = _OPENAI_TYPES.get(status_code, "invalid_request_error")
    param = None
    if isinstance(details, dict) and len(details) == 1:
        param = next(iter(details))
    return {
        "error": {
            "message": message,
            "type": kind,
            "param": param,
            "code": code,
            "details": details,
        }
    }


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The project's handler, answering in OpenAI's error shape for /v1 endpoints."""
    response = exception_handler(exc, context)
    if response is not None:
        error = response.data["error"]
        response.data = openai_error_body(
            response.status_code, error["code"], error["message"], error["details"]
        )
    return response
