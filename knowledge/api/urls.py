from django.urls import path

from knowledge.api import views

urlpatterns = [
    path("knowledge-bases", views.KnowledgeBaseListView.as_view(), name="kb-list"),
    path("knowledge-bases/<uuid:kb_id>", views.KnowledgeBaseDetailView.as_view(), name="kb-detail"),
    path(
        "knowledge-bases/<uuid:kb_id>/documents",
        views.KnowledgeBaseDocumentsView.as_view(),
        name="kb-documents",
    ),
    path(
        "knowledge-bases/<uuid:kb_id>/jobs/<uuid:job_id>",
        views.KnowledgeBaseJobView.as_view(),
        name="kb-job",
    ),
    path(
        "knowledge-bases/<uuid:kb_id>/chunks",
        views.KnowledgeBaseChunksView.as_view(),
        name="kb-chunks",
    ),
    path(
        "knowledge-bases/<uuid:kb_id>/search",
        views.KnowledgeBaseSearchView.as_view(),
        name="kb-search",
    ),
    path("search", views.SearchView.as_view(), name="search"),
]
