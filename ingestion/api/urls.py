from django.urls import path

from ingestion.api import views

urlpatterns = [
    path("flows", views.FlowListView.as_view(), name="flow-list"),
    path("flows/<uuid:flow_id>", views.FlowDetailView.as_view(), name="flow-detail"),
    path("flows/<uuid:flow_id>/runs", views.FlowRunView.as_view(), name="flow-runs"),
    path(
        "flows/<uuid:flow_id>/sessions/<str:session_id>/messages",
        views.FlowSessionMessagesView.as_view(),
        name="flow-session-messages",
    ),
    path("messages", views.MessageListView.as_view(), name="message-list"),
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
