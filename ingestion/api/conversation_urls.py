from django.urls import path, register_converter

from ingestion.api import conversation_views as views


class SessionIdConverter:
    """A session id, slashes included (``SESSION_ID_PATTERN``); node routes come first,
    so ``a/nodes/n/history`` is node ``n`` of session ``a``."""

    regex = r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,254}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(SessionIdConverter, "session")

urlpatterns = [
    path(
        "conversations/<session:session_id>/nodes/<str:node_id>/turns",
        views.NodeTurnsView.as_view(),
        name="node-memory-turns",
    ),
    path(
        "conversations/<session:session_id>/nodes/<str:node_id>/history",
        views.NodeHistoryView.as_view(),
        name="node-memory-history",
    ),
    path(
        "conversations/<session:session_id>/nodes/<str:node_id>",
        views.NodeMemoryView.as_view(),
        name="node-memory",
    ),
    path(
        "conversations/<session:session_id>/history",
        views.ConversationHistoryView.as_view(),
        name="conversation-history",
    ),
]
