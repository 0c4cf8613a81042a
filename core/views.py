from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from core import tenancy
from core.api.errors import json_error_response
from core.authentication import api_key_from_header
from core.health import app_health, health_report
from core.metrics import render_metrics


def _viewer(request: HttpRequest) -> tuple[bool, list[int] | None]:
    """Whether the caller gets the full report (an API key or a staff session; anyone
    else gets the statuses, which a load balancer's probe needs, not versions, queue
    figures or errors) and the owners whose figures it sees: a key, its owner; a staff
    session, every owner (None)."""
    try:
        api_key = api_key_from_header(request)
        if api_key is not None:
            return True, [api_key.owner_id]
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_staff), None
    except Exception:  # noqa: BLE001 - the database may be the thing that is down
        return False, []


def public_report(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"status": report["status"], "time": report["time"]}
    for part in ("database", "pgvector", "worker"):
        if part in report:
            out[part] = {"status": report[part]["status"]}
    if "host" in report.get("worker", {}):  # this host's own worker, for its probe
        out["worker"]["host"] = {"status": report["worker"]["host"]["status"]}
    if "error" in report:
        out["error"] = report["error"]
    return out


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the database and pgvector work (worker state is reported, not required).
    With a key or a staff session, the apps' sections too (``formation``: per owner)."""
    healthy, report = health_report()
    trusted, owner_ids = _viewer(request)
    if trusted and healthy:
        # A key's owner's figures, or (staff) every owner's (core.tenancy).
        scope = tenancy.bypass("healthz") if owner_ids is None else tenancy.as_owner(owner_ids[0])
        with scope:
            report.update(app_health(owner_ids))
    body = report if trusted else public_report(report)
    response = JsonResponse(body, status=200 if healthy else 503)
    if "error" in report:  # the database is unreachable
        response["Retry-After"] = str(settings.DATABASE_RETRY_AFTER)
    return response


def metrics_allowed(request: HttpRequest) -> bool:
    """``Authorization: Bearer <METRICS_TOKEN>`` (compared in constant time) or a staff
    session. Without METRICS_TOKEN only staff sessions get in: the counts span tenants."""
    token = settings.METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").encode("latin-1", "replace")
        if hmac.compare_digest(given, f"Bearer {token}".encode()):
            return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_staff)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        hint = "" if settings.METRICS_TOKEN else " (METRICS_TOKEN is not set: /metrics is closed)"
        response = json_error_response(401, f"Send Authorization: Bearer <METRICS_TOKEN>{hint}.")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    with tenancy.bypass("metrics"):  # counts across owners, for the operator
        body = render_metrics()
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
