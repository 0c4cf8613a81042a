from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def platform(request: HttpRequest) -> dict[str, object]:
    """What the admin needs to warn about: a missing chat LLM."""
    return {"llm_configured": bool(settings.LLM_BASE_URL and settings.LLM_MODEL)}
