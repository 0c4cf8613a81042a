"""Prometheus text exposition of the memory counters."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from core.api.errors import json_error_response
from knowledge.services import knowledge_pending_count
from memories.personal.models import EndUser, MetricCounter, UserVector, Vector

COUNTERS = {
    "memory_additions_total": "Memories added (formation and API).",
    "memory_replacements_total": "Memories replaced after a contradiction or refinement.",
    "memory_dedup_total": "Extracted facts ignored as exact or semantic duplicates.",
    "memory_flipflop_total": "Replacements refused: the stored memory was not older, or (engine) it would undo a recent replacement without a higher confidence.",
    "memory_formation_runs_total": "Formation runs.",
    "memory_llm_calls_total": "LLM calls made by formation.",
    "memory_llm_tokens_total": "LLM tokens used by formation.",
    "memory_llm_malformed_total": "LLM answers that stayed malformed JSON after a retry.",
}


def render_metrics() -> str:
    values = dict(MetricCounter.objects.values_list("name", "value"))
    gauges = {
        "memory_total_count": ("Active (user, memory) links.", UserVector.objects.count()),
        "memory_vectors_count": (
            "Stored memory vectors, global ones included.",
            Vector.objects.count(),
        ),
        "memory_end_users_count": ("Known end users.", EndUser.objects.count()),
        "knowledge_chunks_index_pending": (
            "Chunks waiting for the background HNSW indexer (searched exactly meanwhile).",
            knowledge_pending_count(),
        ),
    }
    lines = []
    for name, (help_text, value) in gauges.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
    for name, help_text in COUNTERS.items():
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} counter",
            f"{name} {values.get(name, 0)}",
        ]
    return "\n".join(lines) + "\n"


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
    return HttpResponse(render_metrics(), content_type="text/plain; version=0.0.4; charset=utf-8")
