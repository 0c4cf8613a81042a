from django.urls import path

from memories.proxy.api import views

urlpatterns = [
    path("v1/chat/completions", views.MemoryToolsChatView.as_view(), name="chat-completions"),
    path("v1/models", views.ModelsView.as_view(), name="models"),
]
