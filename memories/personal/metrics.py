"""Prometheus text exposition of the memory counters."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

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


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if settings.METRICS_TOKEN:
        if request.headers.get("Authorization", "") != f"Bearer {settings.METRICS_TOKEN}":
            return HttpResponse("unauthorized\n", status=401, content_type="text/plain")
    return HttpResponse(render_metrics(), content_type="text/plain; version=0.0.4; charset=utf-8")
