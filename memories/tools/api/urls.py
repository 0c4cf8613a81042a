from django.urls import path

from memories.tools.api import views

urlpatterns = [
    path("tools", views.ToolListView.as_view(), name="tool-list"),
    path("tools/<str:name>/call", views.ToolCallView.as_view(), name="tool-call"),
]
