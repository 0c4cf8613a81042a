"""The one family of errors that services raise.

Each carries a machine-readable ``code``, an HTTP ``status_code`` and optional
``details``; the API's exception handler (``core.api.errors``) maps them to
``{"error": {"code", "message", "details"}}`` once, so views never catch them. Rooms
subclass these with their own codes (``JobConflict(Conflict)`` "job_active", ...).
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, code: str | None = None, details: Any = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.details = details


class InvalidInput(ServiceError):
    status_code = 400
    code = "invalid"

    @classmethod
    def at(cls, path: str, said: str, *, code: str | None = None) -> InvalidInput:
        """The error of one field: ``message`` names it by its path, ``details`` holds
        the same words as that field's list (the API's error shape)."""
        return cls(f"{path}: {said}", code=code, details={path: [said]})


class NotFound(ServiceError):
    status_code = 404
    code = "not_found"


class Conflict(ServiceError):
    status_code = 409
    code = "conflict"


class NameTaken(Conflict):
    """A name that must be unique per owner is in use (the database said so)."""

    code = "name_taken"


class ReadOnlyKey(ServiceError):
    """The request's API key is read-only, and this would change something."""

    status_code = 403
    code = "read_only_key"


class KeyLimitExceeded(ServiceError):
    """The request's API key is narrowed (``core.key_limits``) and this reaches outside."""

    status_code = 403
    code = "key_limit"


class Unprocessable(ServiceError):
    status_code = 422
    code = "unprocessable"


class Unavailable(ServiceError):
    status_code = 503
    code = "service_unavailable"
