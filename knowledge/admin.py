from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.defaultfilters import filesizeformat
from django.utils.html import format_html

from core.admin import NoDjangoDeleteMixin, OwnerValidatedForm
from core.admin_confirm import confirm_first
from core.errors import ServiceError
from knowledge.models import Chunk, IngestJob, KnowledgeBase
from knowledge.selectors import with_live_chunks
from knowledge.services import knowledge_base_delete
from knowledge.services.bases import knowledge_base_holder

MEMORY_BASE_KB_TEXT = (
    "{name} is a memory base's own knowledge base and is not deleted here: delete the "
    "memory base instead (Memory bases), which deletes its knowledge base with it."
)


@admin.register(KnowledgeBase)
class KnowledgeBaseAdmin(admin.ModelAdmin):
    form = OwnerValidatedForm  # (a name taken by the same owner: a form error)
    list_display = ["name", "owner", "kind", "chunks", "size", "embedding", "updated"]
    list_filter = ["is_memory_base", "source_kind", "embedding_provider"]
    list_select_related = ["owner"]
    search_fields = ["name", "owner__username"]
    # What shaped the stored chunks is fixed at creation (the API refuses it too).
    readonly_fields = [
        "owner",
        "source_kind",
        "language",
        "chunk_size",
        "chunk_overlap",
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

    def get_queryset(self, request: HttpRequest) -> QuerySet[KnowledgeBase]:
        return with_live_chunks(super().get_queryset(request))

    @admin.display(description="kind", ordering="is_memory_base")
    def kind(self, obj: KnowledgeBase) -> str:
        return "memory base" if obj.is_memory_base else obj.source_kind

    @admin.display(description="chunks", ordering="live_chunks")
    def chunks(self, obj: KnowledgeBase) -> int:
        return int(getattr(obj, "live_chunks", obj.chunk_count))

    @admin.display(description="embedding", ordering="embedding_model")
    def embedding(self, obj: KnowledgeBase) -> str:
        return f"{obj.embedding_model} · {obj.embedding_dimensions}"

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: KnowledgeBase) -> str:
        return f"{obj.updated_at:%Y-%m-%d %H:%M}"

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

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # A memory base's (or a memory store's) base is named by its holder: the API
        # refuses to rename it too.
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None and knowledge_base_holder(obj) is not None:
            fields = ["name", "description", *fields]
        return fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A memory base's own knowledge base goes with its memory base.
        if obj is not None and obj.is_memory_base:
            return False
        return super().has_delete_permission(request, obj)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        kb = self.get_object(request, object_id)
        if kb is not None and kb.is_memory_base and request.method == "GET":
            messages.warning(request, MEMORY_BASE_KB_TEXT.format(name=kb.name))
        return super().change_view(request, object_id, form_url, extra_context)

    def delete_model(self, request: HttpRequest, obj: KnowledgeBase) -> None:
        knowledge_base_delete(knowledge_base=obj)

    @admin.action(
        description="Delete selected knowledge bases and their chunks", permissions=["delete"]
    )
    @confirm_first(
        title="Delete these knowledge bases?",
        consequences=[
            "delete the knowledge bases and every chunk they hold (this cannot be undone);",
            "memory bases' own knowledge bases are skipped: delete the memory base instead.",
        ],
        button="Yes, delete",
    )
    def delete_with_chunks(self, request: HttpRequest, queryset: QuerySet[KnowledgeBase]) -> None:
        deleted = []
        for kb in queryset:
            if kb.is_memory_base:
                self.message_user(request, MEMORY_BASE_KB_TEXT.format(name=kb.name), messages.ERROR)
                continue
            try:
                knowledge_base_delete(knowledge_base=kb)
            except ServiceError as exc:  # (a file store's base: "in use", was a 500)
                self.message_user(request, f"{kb.name}: {exc}", messages.ERROR)
                continue
            deleted.append(kb.name)
        if deleted:
            self.message_user(request, f"Deleted {', '.join(deleted)} and their chunks.")


@admin.register(Chunk)
class ChunkAdmin(NoDjangoDeleteMixin, admin.ModelAdmin):
    # (a read-only browser: a chunk deleted here left its base's counters stale and a
    # memory base mismatched; chunks go with their document, session or base)
    """A read-only chunk browser. The embedding is never loaded or rendered."""

    # Few narrow columns so the text gets the width (source type is a filter; the
    # timestamps and every other column are on the chunk's own page).
    list_display = ["key", "knowledge_base", "session_id", "excerpt"]
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

    @admin.display(description="source key", ordering="source_key")
    def key(self, chunk: Chunk) -> str:
        """A content-addressed key (``sha256:<64 hex>#n``) shortened to its first 12 hex
        digits: the whole key is on the chunk's own page."""
        head, sep, rest = chunk.source_key.partition(":")
        if head == "sha256" and len(rest) > 40:
            digest, hash_sep, index = rest.partition("#")
            return f"sha256:{digest[:12]}…{hash_sep}{index}"
        return chunk.source_key

    @admin.display(description="text")
    def excerpt(self, obj: Chunk) -> str:
        # Two lines at most in the list (the stylesheet clamps it); the whole text is on
        # the chunk's own page.
        text = obj.text[:300] + ("…" if len(obj.text) > 300 else "")
        return format_html(
            '<span class="chunk-excerpt" title="{}">{}</span>', obj.text[:2000], text
        )

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
