from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from core.authentication import api_key_from_header
from core.health import health_report


def _trusted(request: HttpRequest) -> bool:
    """An API key or a staff session: the full report. Anyone else gets the statuses
    (a load balancer's probe needs no more), not versions, queue figures or errors."""
    try:
        if api_key_from_header(request) is not None:
            return True
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_staff)
    except Exception:  # noqa: BLE001 - the database may be the thing that is down
        return False


def public_report(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"status": report["status"], "time": report["time"]}
    for part in ("database", "pgvector", "worker"):
        if part in report:
            out[part] = {"status": report[part]["status"]}
    if "error" in report:
        out["error"] = report["error"]
    return out


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the database and pgvector work (worker state is reported, not required)."""
    healthy, report = health_report()
    body = report if _trusted(request) else public_report(report)
    response = JsonResponse(body, status=200 if healthy else 503)
    if "error" in report:  # the database is unreachable
        response["Retry-After"] = str(settings.DATABASE_RETRY_AFTER)
    return response
