from django.urls import path

from memories.engine.api import views

urlpatterns = [
    path("engine/facts", views.FactsView.as_view(), name="engine-facts"),
    path("engine/facts/<uuid:fact_id>", views.FactDetailView.as_view(), name="engine-fact"),
    path(
        "engine/facts/<uuid:fact_id>/history",
        views.FactHistoryView.as_view(),
        name="engine-fact-history",
    ),
    path("engine/search", views.SearchView.as_view(), name="engine-search"),
    path("engine/injection", views.InjectionView.as_view(), name="engine-injection"),
    path("engine/erase", views.EraseView.as_view(), name="engine-erase"),
]
