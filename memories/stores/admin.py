from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from core.admin_confirm import confirm_first
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.services import backend_for, memory_store_delete


class AttachmentInline(admin.TabularInline):
    model = MemoryAttachment
    fields = [
        "flow",
        "node_id",
        "position",
        "retrieve_stage",
        "top_k",
        "similarity_threshold",
        "read",
        "write",
    ]
    readonly_fields = tuple(fields)
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # attachments come from the declarative config (validated there)

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryAttachment]:
        return super().get_queryset(request).select_related("store", "flow")


@admin.register(MemoryStore)
class MemoryStoreAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "type", "item_count", "embedding_model", "updated_at"]
    list_filter = ["type"]
    list_select_related = ["owner", "knowledge_base"]
    search_fields = ["name", "owner__username"]
    raw_id_fields = ["owner"]
    readonly_fields = [
        "name",
        "owner",
        "type",
        "config",
        "embedding_provider",
        "embedding_model",
        "embedding_dimensions",
        "knowledge_base",
        "created_at",
        "updated_at",
    ]
    inlines = [AttachmentInline]
    actions = ["delete_with_items"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryStore]:
        return super().get_queryset(request).annotate(own_items=Count("items"))

    @admin.display(description="items", ordering="own_items")
    def item_count(self, obj: MemoryStore) -> int:
        counted = backend_for(obj).item_count()
        return counted if counted is not None else obj.own_items  # type: ignore[attr-defined]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Stores are validated by their type: created through the API or a config file.
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def delete_model(self, request: HttpRequest, obj: MemoryStore) -> None:
        memory_store_delete(store=obj)

    @admin.action(description="Delete selected stores with their items and attachments")
    @confirm_first(
        title="Delete these memory stores?",
        consequences=[
            "delete the stores and every item they hold (this cannot be undone),",
            "detach them from every agent node they are attached to.",
            "A file store's files on disk are kept.",
        ],
        button="Yes, delete",
    )
    def delete_with_items(self, request: HttpRequest, queryset: QuerySet[MemoryStore]) -> None:
        names = []
        for store in list(queryset):
            memory_store_delete(store=store)
            names.append(store.name)
        self.message_user(request, f"Deleted {', '.join(names)} with their items and attachments.")


@admin.register(MemoryItem)
class MemoryItemAdmin(admin.ModelAdmin):
    """Items per store: browse and delete; the embedding is never loaded or rendered."""

    list_display = ["id", "store", "excerpt", "session_id", "created_at"]
    list_filter = [("store", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["store"]
    search_fields = ["content_summary", "=session_id"]
    raw_id_fields = ["store"]
    exclude = ["embedding"]
    readonly_fields = [
        "store",
        "content_summary",
        "summary_hash",
        "input_snapshot",
        "output_snapshot",
        "metadata",
        "session_id",
        "created_at",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryItem]:
        return super().get_queryset(request).defer("embedding")

    @admin.display(description="summary")
    def excerpt(self, obj: MemoryItem) -> str:
        return obj.content_summary[:100]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
