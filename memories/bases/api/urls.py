from django.urls import path

from core.validation import register_converters
from memories.bases.api import views

register_converters()


def _memory_base_routes(prefix: str, suffix: str = "") -> list:
    """``/memory-bases`` is the documented path; ``/memories`` (the seed's name) stays."""
    return [
        path(prefix, views.MemoryBaseListView.as_view(), name=f"memory-base-list{suffix}"),
        path(
            f"{prefix}/<uuid:mb_id>",
            views.MemoryBaseDetailView.as_view(),
            name=f"memory-base-detail{suffix}",
        ),
        path(
            f"{prefix}/<uuid:mb_id>/sessions",
            views.MemoryBaseSessionsView.as_view(),
            name=f"memory-base-sessions{suffix}",
        ),
        path(
            f"{prefix}/<uuid:mb_id>/flush",
            views.MemoryBaseFlushView.as_view(),
            name=f"memory-base-flush{suffix}",
        ),
        path(
            f"{prefix}/<uuid:mb_id>/update",
            views.MemoryBaseFlushView.as_view(),
            name=f"memory-base-update{suffix}",
        ),
        path(
            f"{prefix}/<uuid:mb_id>/regenerate",
            views.MemoryBaseRegenerateView.as_view(),
            name=f"memory-base-regenerate{suffix}",
        ),
    ]


urlpatterns = [
    path(
        "flows/<uuid:flow_id>/sessions/<session:session_id>/messages",
        views.FlowSessionMessagesView.as_view(),
        name="flow-session-messages",
    ),
    *_memory_base_routes("memory-bases"),
    *_memory_base_routes("memories", "-seed"),
    path("jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
]
