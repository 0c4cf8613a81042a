from django.urls import path

from core.api import views

urlpatterns = [
    path("me", views.MeView.as_view(), name="me"),
    path("usage", views.UsageView.as_view(), name="usage"),
    path("api-keys", views.APIKeyListView.as_view(), name="api-key-list"),
    path("api-keys/<int:key_id>", views.APIKeyDetailView.as_view(), name="api-key-detail"),
]
