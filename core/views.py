from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from core.health import health_report


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the database and pgvector work (worker state is reported, not required)."""
    healthy, report = health_report()
    return JsonResponse(report, status=200 if healthy else 503)
