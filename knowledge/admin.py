from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat

from knowledge.models import Chunk, IngestJob, KnowledgeBase
from knowledge.services import knowledge_base_delete


@admin.register(KnowledgeBase)
class KnowledgeBaseAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "owner",
        "is_memory_base",
        "source_kind",
        "chunk_count",
        "size",
        "embedding_model",
        "embedding_dimensions",
        "updated_at",
    ]
    list_filter = ["is_memory_base", "source_kind", "embedding_provider"]
    list_select_related = ["owner"]
    search_fields = ["name", "owner__username"]
    raw_id_fields = ["owner"]
    readonly_fields = [
        "embedding_provider",
        "embedding_model",
        "embedding_dimensions",
        "is_memory_base",
        "chunk_count",
        "word_count",
        "char_count",
        "size_bytes",
        "source_types",
        "created_at",
        "updated_at",
    ]
    actions = ["delete_with_chunks"]

    @admin.display(description="size", ordering="size_bytes")
    def size(self, obj: KnowledgeBase) -> str:
        return filesizeformat(obj.size_bytes)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Creation fixes the embedding configuration: done through the API or a service.
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def delete_model(self, request: HttpRequest, obj: KnowledgeBase) -> None:
        knowledge_base_delete(knowledge_base=obj)

    @admin.action(description="Delete selected knowledge bases and their chunks")
    def delete_with_chunks(self, request: HttpRequest, queryset: QuerySet[KnowledgeBase]) -> None:
        count = 0
        for kb in queryset:
            knowledge_base_delete(knowledge_base=kb)
            count += 1
        self.message_user(request, f"Deleted {count} knowledge base(s).")


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    """A read-only chunk browser. The embedding is never loaded or rendered."""

    list_display = [
        "source_key",
        "knowledge_base",
        "session_id",
        "source_type",
        "excerpt",
        "updated_at",
    ]
    list_filter = [
        "source_type",
        "knowledge_base__is_memory_base",
        "index_pending",
        ("knowledge_base", admin.RelatedOnlyFieldListFilter),
    ]
    list_select_related = ["knowledge_base"]
    search_fields = ["=session_id", "=flow_id", "=document_key", "=message_id"]
    search_help_text = (
        "Words of the text (full-text search), or an exact session, flow, document or message id."
    )
    raw_id_fields = ["knowledge_base"]
    exclude = ["embedding"]
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Chunk]:
        return super().get_queryset(request).defer("embedding")

    def get_readonly_fields(self, request: HttpRequest, obj: Chunk | None = None) -> list[str]:
        return [f.name for f in Chunk._meta.fields if f.name != "embedding"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Chunk | None = None) -> bool:
        return False

    @admin.display(description="text")
    def excerpt(self, obj: Chunk) -> str:
        return obj.text[:120] + ("…" if len(obj.text) > 120 else "")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Chunk], search_term: str
    ) -> tuple[QuerySet[Chunk], bool]:
        exact, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        if not search_term.strip():
            return exact, may_have_duplicates
        # Text goes through the GIN-indexed tsvector, not a sequential ILIKE.
        words = queryset.extra(
            where=["search_vector @@ plainto_tsquery(fts_config, %s)"], params=[search_term]
        )
        return exact | words, may_have_duplicates


@admin.register(IngestJob)
class IngestJobAdmin(admin.ModelAdmin):
    """Background ingestion batches (read-only; the payload is never rendered)."""

    list_display = [
        "id",
        "knowledge_base",
        "status",
        "document_count",
        "chunks_written",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status"]
    list_select_related = ["knowledge_base"]
    exclude = ["documents"]
    readonly_fields = [f.name for f in IngestJob._meta.fields if f.name != "documents"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[IngestJob]:
        return super().get_queryset(request).defer("documents")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: IngestJob | None = None) -> bool:
        return False
