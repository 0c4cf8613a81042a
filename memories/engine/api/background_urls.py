"""Routes of the engine's background tiers, under /api/v1/engine/."""

from django.urls import path

from memories.engine.api import background as views

urlpatterns = [
    path("flush", views.FlushView.as_view(), name="engine-flush"),
    path("updates", views.UpdatesView.as_view(), name="engine-updates"),
    path("journal", views.JournalView.as_view(), name="engine-journal"),
    path("dream", views.DreamView.as_view(), name="engine-dream"),
    path("dreams", views.DreamListView.as_view(), name="engine-dreams"),
    path("dreams/<uuid:dream_id>", views.DreamDetailView.as_view(), name="engine-dream-detail"),
    path("dreams/<uuid:dream_id>/undo", views.DreamUndoView.as_view(), name="engine-dream-undo"),
    path("settings", views.EngineSettingsView.as_view(), name="engine-settings"),
    path("summaries", views.SummariesView.as_view(), name="engine-summaries"),
]
