from django.urls import path

from memories.personal.api import views

urlpatterns = [
    path("users/<str:user_id>/memories", views.UserMemoriesView.as_view(), name="user-memories"),
    path(
        "users/<str:user_id>/memories/search",
        views.UserMemorySearchView.as_view(),
        name="user-memory-search",
    ),
    path(
        "users/<str:user_id>/memories/<uuid:memory_id>",
        views.UserMemoryDetailView.as_view(),
        name="user-memory-detail",
    ),
    path(
        "users/<str:user_id>/memories/<uuid:memory_id>/history",
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
