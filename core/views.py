from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from core.health import health_report


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the database and pgvector work (worker state is reported, not required)."""
    healthy, report = health_report()
    response = JsonResponse(report, status=200 if healthy else 503)
    if "error" in report:  # the database is unreachable
        response["Retry-After"] = str(settings.DATABASE_RETRY_AFTER)
    return response
