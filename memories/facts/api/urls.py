from django.urls import path

from core.validation import register_converters
from memories.facts.api import views

register_converters()

urlpatterns = [
    # "users/<end_user:user_id>/memories" (user-memories): ingestion.api.urls, whose view
    # adds POST to views.UserMemoriesView.
    path(
        "users/<end_user:user_id>/memories/search",
        views.UserMemorySearchView.as_view(),
        name="user-memory-search",
    ),
    path(
        "users/<end_user:user_id>/memories/<uuid:memory_id>",
        views.UserMemoryDetailView.as_view(),
        name="user-memory-detail",
    ),
    path(
        "users/<end_user:user_id>/memories/<uuid:memory_id>/history",
        views.UserMemoryHistoryView.as_view(),
        name="user-memory-history",
    ),
    path("global-memories", views.GlobalMemoriesView.as_view(), name="global-memories"),
    path(
        "global-memories/<uuid:memory_id>",
        views.GlobalMemoryDetailView.as_view(),
        name="global-memory-detail",
    ),
]
