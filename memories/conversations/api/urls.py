from django.urls import path

from core.validation import register_converters
from memories.conversations.api import views

# Node routes come first, so ``a/nodes/n/history`` is node ``n`` of session ``a``.
register_converters()

urlpatterns = [
    path("flows", views.FlowListView.as_view(), name="flow-list"),
    path("flows/<uuid:flow_id>", views.FlowDetailView.as_view(), name="flow-detail"),
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
        name="conversation-node-memory",
    ),
    path(
        "conversations/<session:session_id>/history",
        views.ConversationHistoryView.as_view(),
        name="conversation-history",
    ),
]
