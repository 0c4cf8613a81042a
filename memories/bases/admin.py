from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from core.errors import ServiceError
from memories.bases.models import MemoryBase, MemoryBaseJob, MemoryBaseSession
from memories.bases.selectors import (
    memory_base_pending_total,
    sessions_with_status,
    with_counters,
)
from memories.bases.services import (
    memory_base_delete,
    memory_base_flush,
    memory_base_regenerate,
)

MISMATCH_TEXT = (
    "Mismatch detected: {processed} message(s) were processed but the knowledge base holds "
    "no chunks. Run the Regenerate action to rebuild it."
)


class MemoryBaseSessionInline(admin.TabularInline):
    model = MemoryBaseSession
    extra = 0
    can_delete = False
    fields = ["session_id", "pending", "total_processed", "last_sync_at", "cursor_message_id"]
    readonly_fields = tuple(fields)
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryBaseSession]:
        return sessions_with_status(super().get_queryset(request))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="pending")
    def pending(self, session: MemoryBaseSession) -> int:
        return session.pending


@admin.register(MemoryBase)
class MemoryBaseAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "owner",
        "flow",
        "threshold",
        "auto_capture",
        "sessions_count",
        "pending",
        "processed",
        "chunks",
        "last_sync",
        "status",
    ]
    list_editable = ["auto_capture"]
    list_filter = ["auto_capture"]
    search_fields = ["name", "owner__username", "flow__name"]
    raw_id_fields = ["owner", "flow", "knowledge_base"]
    readonly_fields = ["knowledge_base", "kb_name", "created_at"]
    inlines = [MemoryBaseSessionInline]
    actions = ["sync_now", "regenerate", "delete_with_knowledge_base"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryBase]:
        return with_counters(super().get_queryset(request))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # created through the API, which also creates its knowledge base

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="sessions", ordering="session_count")
    def sessions_count(self, mb: MemoryBase) -> int:
        return mb.session_count

    @admin.display(description="pending")
    def pending(self, mb: MemoryBase) -> int:
        # One query per row on the list page (a page holds at most 100 bases).
        return memory_base_pending_total(memory_base=mb)

    @admin.display(description="processed", ordering="processed_total")
    def processed(self, mb: MemoryBase) -> int:
        return mb.processed_total

    @admin.display(description="chunks")
    def chunks(self, mb: MemoryBase) -> int:
        return mb.knowledge_base.chunk_count if mb.has_chunks else 0

    @admin.display(description="last sync", ordering="last_sync")
    def last_sync(self, mb: MemoryBase) -> Any:
        return mb.last_sync

    @admin.display(description="status")
    def status(self, mb: MemoryBase) -> str:
        if mb.mismatch:
            return format_html(
                '<strong class="mismatch" style="color:#ba2121">⚠ {}</strong>', "Mismatch detected"
            )
        if mb.active_jobs:
            return f"syncing ({mb.active_jobs})"
        return "ok"

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        mb = self.get_queryset(request).filter(pk=object_id).first()
        if mb is not None and mb.mismatch and request.method == "GET":
            messages.warning(request, MISMATCH_TEXT.format(processed=mb.processed_total))
        return super().change_view(request, object_id, form_url, extra_context)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if request.method == "GET":
            broken = [mb.name for mb in self.get_queryset(request) if mb.mismatch]
            if broken:
                messages.warning(
                    request,
                    f"Mismatch detected in {', '.join(broken)}: processed messages but no chunks. "
                    "Select and run “Regenerate”.",
                )
        return super().changelist_view(request, extra_context)

    def delete_model(self, request: HttpRequest, obj: MemoryBase) -> None:
        memory_base_delete(memory_base=obj)

    @admin.action(description="Sync now (ingest pending messages, ignoring the threshold)")
    def sync_now(self, request: HttpRequest, queryset: QuerySet[MemoryBase]) -> None:
        self._run(request, queryset, memory_base_flush, "Queued {n} ingestion job(s).")

    @admin.action(description="Regenerate (clear the knowledge base and re-ingest everything)")
    def regenerate(self, request: HttpRequest, queryset: QuerySet[MemoryBase]) -> None:
        self._run(request, queryset, memory_base_regenerate, "Regenerating: queued {n} job(s).")

    @admin.action(description="Delete selected memory bases and their knowledge bases")
    def delete_with_knowledge_base(
        self, request: HttpRequest, queryset: QuerySet[MemoryBase]
    ) -> None:
        names = []
        for mb in list(queryset):
            memory_base_delete(memory_base=mb)
            names.append(mb.name)
        self.message_user(request, f"Deleted {', '.join(names)}.")

    def _run(
        self, request: HttpRequest, queryset: QuerySet[MemoryBase], service: Any, text: str
    ) -> None:
        total = 0
        for mb in queryset:
            try:
                total += len(service(memory_base=mb))
            except ServiceError as exc:
                self.message_user(request, f"{mb.name}: {exc}", level=messages.ERROR)
        self.message_user(request, text.format(n=total))


@admin.register(MemoryBaseJob)
class MemoryBaseJobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "memory_base",
        "session",
        "trigger",
        "status",
        "messages_processed",
        "chunks_written",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "trigger"]
    list_select_related = ["memory_base", "session"]
    raw_id_fields = ["memory_base", "session"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
