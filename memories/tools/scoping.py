"""Scope values a request carries: the end-user header fills ``user_id``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings


def request_values(request: Any, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    filled = dict(values or {})
    header = request.headers.get(settings.MEMORY_USER_HEADER)
    if header and not filled.get("user_id"):
        filled["user_id"] = header
    return filled
