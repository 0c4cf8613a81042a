"""One JSON error shape for the whole API: ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.db_recovery import as_database_unavailable, response_for_current_exception
from core.providers.errors import ProviderError, ProviderNotConfigured


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The resource is busy or already exists."
    default_code = "conflict"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class Unprocessable(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "The request is well-formed but cannot be processed."
    default_code = "unprocessable"


class ServiceUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "A required service is not available."
    default_code = "service_unavailable"


class APIError(exceptions.APIException):
    """An error with a chosen status, code and machine-readable details."""

    def __init__(self, *, status_code: int, code: str, message: str, details: Any = None):
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.code = code
        self.details = details


def provider_api_error(exc: ProviderError) -> APIError:
    if isinstance(exc, ProviderNotConfigured):
        return APIError(
            status_code=503,
            code="not_configured",
            message=str(exc),
            details={"variable": exc.variable},
        )
    codes = {429: "upstream_rate_limited", 504: "upstream_timeout"}
    return APIError(
        status_code=exc.status_code,
        code=codes.get(exc.status_code, "upstream_error"),
        message=str(exc),
    )


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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ProviderError):
        exc = provider_api_error(exc)
    unavailable = as_database_unavailable(exc)
    if unavailable is not None:
        exc = APIError(status_code=503, code=unavailable.code, message=str(unavailable))
        exc.wait = unavailable.retry_after  # DRF's handler turns it into Retry-After
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    status_code = response.status_code
    if isinstance(exc, APIError):
        body = error_body(exc.code, str(exc.detail), exc.details)
    elif isinstance(exc, exceptions.ValidationError):
        body = error_body("invalid", "The request is invalid.", exc.detail)
    else:
        detail = getattr(exc, "detail", None)
        code = _CODES.get(status_code, "error")
        if isinstance(exc, exceptions.APIException) and status_code not in (401, 403, 404):
            code = str(getattr(exc, "default_code", code))
        body = error_body(code, _message(detail, str(exc)), None)
    response.data = body
    return response


def json_error_response(status_code: int, message: str, details: Any = None) -> JsonResponse:
    return JsonResponse(
        error_body(_CODES.get(status_code, "error"), message, details), status=status_code
    )


def json_404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(("/api/", "/v1/")):
        return json_error_response(404, "Not found.")
    return defaults.page_not_found(request, exception or Http404())


def json_500(request: HttpRequest) -> HttpResponse:
    unavailable = response_for_current_exception(request)
    if unavailable is not None:  # every path: the admin cannot render without it either
        return unavailable
    if request.path.startswith(("/api/", "/v1/")):
        return json_error_response(500, "Internal server error.")
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
        message = error["message"]
        if error["code"] == "invalid" and isinstance(error["details"], dict):
            field, problems = next(iter(error["details"].items()))
            message = (
                f"{field}: {problems[0] if isinstance(problems, list) and problems else problems}"
            )
        response.data = openai_error_body(
            response.status_code, error["code"], message, error["details"]
        )
    return response
