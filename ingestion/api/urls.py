from django.urls import path

from ingestion.api import views

urlpatterns = [
    path("flows/<uuid:flow_id>/runs", views.FlowRunView.as_view(), name="flow-runs"),
    path("messages", views.MessageListView.as_view(), name="message-list"),
]
