from django.urls import path

from memories.bases.api import views

urlpatterns = [
    path(
        "flows/<uuid:flow_id>/sessions/<str:session_id>/messages",
        views.FlowSessionMessagesView.as_view(),
        name="flow-session-messages",
    ),
    path("memories", views.MemoryBaseListView.as_view(), name="memory-base-list"),
    path("memories/<uuid:mb_id>", views.MemoryBaseDetailView.as_view(), name="memory-base-detail"),
    path(
        "memories/<uuid:mb_id>/sessions",
        views.MemoryBaseSessionsView.as_view(),
        name="memory-base-sessions",
    ),
    path(
        "memories/<uuid:mb_id>/flush", views.MemoryBaseFlushView.as_view(), name="memory-base-flush"
    ),
    path(
        "memories/<uuid:mb_id>/update",
        views.MemoryBaseFlushView.as_view(),
        name="memory-base-update",
    ),
    path(
        "memories/<uuid:mb_id>/regenerate",
        views.MemoryBaseRegenerateView.as_view(),
        name="memory-base-regenerate",
    ),
    path("jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
]
