from __future__ import annotations

from datetime import timedelta

from django.http import HttpRequest
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from core import audit, replicas, tenancy
from core.models import APIKey
from core.selectors import api_key_authenticate
from core.services import api_key_digest

# Writing last_used_at on every request would turn reads into writes; a coarse
# resolution is enough to see which keys are alive.
LAST_USED_RESOLUTION = timedelta(minutes=5)


def api_key_from_header(request: HttpRequest) -> APIKey | None:
    """The live key in ``Authorization: Bearer <key>``, if any (for plain Django views)."""
    parts = authentication.get_authorization_header(request).decode("latin-1").split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return api_key_authenticate(digest=api_key_digest(parts[1]))


class APIKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <key>``, as OpenAI-compatible clients send it."""

    keyword = "Bearer"

    def authenticate(self, request: Request):  # type: ignore[override]
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if not parts:  # only whitespace (a lone 0xA0 or 0x85 byte decodes to one)
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        if parts[0].lower() != self.keyword.lower():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        api_key = api_key_authenticate(digest=api_key_digest(parts[1]))
        if api_key is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked API key.")
        setattr(request._request, audit.KEY_ATTRIBUTE, api_key)  # (who acts: core.audit)
        tenancy.enter_owner(api_key.owner_id)  # its rows only, from now on (core.tenancy)
        replicas.owner_known(api_key.owner_id)  # a read chooses its server now
        now = timezone.now()
        if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
            APIKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        return api_key.owner, api_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class SessionAuthentication(authentication.SessionAuthentication):
    """DRF's session authentication (a user signed in to the console), running the
    request as that user's rows (``core.tenancy``)."""

    def authenticate(self, request: Request):  # type: ignore[override]
        result = super().authenticate(request)
        if result is not None:
            tenancy.enter_owner(result[0].pk)
        return result
