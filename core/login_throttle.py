"""The admin login slows repeated failures: after ``ADMIN_LOGIN_MAX_FAILURES`` wrong
passwords for one username (or four times as many from one address, which may be a
proxy's), further attempts are refused without checking the password until
``ADMIN_LOGIN_LOCKOUT_SECONDS`` after the first failure. Counters live in the default
(database) cache, so every web process sees them."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.cache import cache
from django.core.exceptions import ValidationError


def _keys(username: str, address: str) -> list[tuple[str, int]]:
    limit = settings.ADMIN_LOGIN_MAX_FAILURES
    return [
        (f"login-failures:user:{username.strip().lower()[:150]}", limit),
        (f"login-failures:ip:{address}", limit * 4),
    ]


def login_locked(username: str, address: str) -> bool:
    counts = cache.get_many([key for key, _ in _keys(username, address)])
    return any(counts.get(key, 0) >= limit for key, limit in _keys(username, address))


def login_failed(username: str, address: str) -> None:
    for key, _ in _keys(username, address):
        # The window starts at the first failure (add does nothing when the key exists).
        cache.add(key, 0, settings.ADMIN_LOGIN_LOCKOUT_SECONDS)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, settings.ADMIN_LOGIN_LOCKOUT_SECONDS)


def login_succeeded(username: str) -> None:
    cache.delete(_keys(username, "")[0][0])


class ThrottledAdminLoginForm(AdminAuthenticationForm):
    error_messages = {
        **AdminAuthenticationForm.error_messages,
        "locked": "Too many failed login attempts. Try again in %(minutes)d minutes.",
    }

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        address = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        if login_locked(username, address):
            minutes = max(1, round(settings.ADMIN_LOGIN_LOCKOUT_SECONDS / 60))
            raise ValidationError(
                self.error_messages["locked"], code="locked", params={"minutes": minutes}
            )
        try:
            cleaned = super().clean()
        except ValidationError:
            login_failed(username, address)
            raise
        login_succeeded(username)
        return cleaned
