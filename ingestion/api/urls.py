from django.urls import path

from core.validation import register_converters
from ingestion.api import engine_updates, portability, user_memories, views

register_converters()

urlpatterns = [
    path("flows/<uuid:flow_id>/runs", views.FlowRunView.as_view(), name="flow-runs"),
    path("messages", views.MessageListView.as_view(), name="message-list"),
    path("export", portability.ExportView.as_view(), name="memory-export"),
    path("engine/updates/run", engine_updates.UpdatesRunView.as_view(), name="engine-updates-run"),
    path("import", portability.ImportView.as_view(), name="memory-import"),
    path(
        "users/<end_user:user_id>/memories",
        user_memories.UserMemoriesView.as_view(),
        name="user-memories",
    ),
]
