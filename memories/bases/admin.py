from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import F, Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timezone import localtime

from core.admin import OwnerValidatedForm
from core.admin_confirm import confirm_first, confirmation_page, is_confirmed
from core.errors import ServiceError
from memories.bases.api.serializers import MemoryBaseUpdateSerializer
from memories.bases.models import MemoryBase, MemoryBaseJob, MemoryBaseSession
from memories.bases.selectors import (
    lost_sessions,
    session_status,
    sessions_with_status,
    with_counters,
    with_pending_total,
)
from memories.bases.services import (
    memory_base_delete,
    memory_base_flush,
    memory_base_regenerate,
)

MISMATCH_TEXT = "Mismatch detected: {what}. Press Regenerate… above to rebuild it."


def mismatch_text(mb: MemoryBase) -> str:
    """What is wrong, as the counters beside it show it: an empty knowledge base, or
    sessions whose chunks are gone while others' remain."""
    if not mb.chunk_total:
        what = (
            f"{mb.processed_total} message(s) were processed but the knowledge base holds no chunks"
        )
    else:
        lost = lost_sessions(MemoryBaseSession.objects.filter(memory_base=mb)).count()
        what = f"the chunks of {lost} processed session(s) are gone from the knowledge base"
    return MISMATCH_TEXT.format(what=what)


INLINE_SESSIONS = 100  # sessions a memory base's page lists


class MemoryBaseSessionInline(admin.TabularInline):
    model = MemoryBaseSession
    extra = 0
    can_delete = False
    fields = [
        "session_id",
        "pending",
        "total_processed",
        "last_sync_at",
        "session_status",
        "cursor_message_id",
    ]
    readonly_fields = tuple(fields)
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryBaseSession]:
        # At most INLINE_SESSIONS rows (2,000 sessions made a 3 MB page of 2.6 s): those
        # synced last, the counters above say how many there are.
        qs = super().get_queryset(request)
        match = request.resolver_match
        base_id = match.kwargs.get("object_id") if match else None
        if base_id is not None:
            shown = (
                qs.filter(memory_base_id=base_id)
                .order_by(F("last_sync_at").desc(nulls_last=True), "-id")
                .values_list("pk", flat=True)[:INLINE_SESSIONS]
            )
            qs = qs.filter(pk__in=shown)  # (a subquery with its LIMIT: one statement)
        return sessions_with_status(qs)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # (read-only rows: Django leaves them out of a save's validation)

    @admin.display(description="pending")
    def pending(self, session: MemoryBaseSession) -> int:
        return session.pending

    @admin.display(description="status")
    def session_status(self, session: MemoryBaseSession) -> str:
        return session_status(session)


REGENERATE_CONSEQUENCES = [
    "reset every session's cursor,",
    "delete all chunks of the memory base's knowledge base,",
    "re-ingest every captured output from the start, in the background.",
]
DELETE_CONSEQUENCES = [
    "cancel their queued and running jobs,",
    "delete the memory bases, their sessions and their knowledge bases with every chunk.",
    "The flows and their captured messages are kept.",
]


class MemoryBaseForm(OwnerValidatedForm):
    """What the API's PATCH refuses, refused here too (a threshold of 2,147,483,647 was
    saved, and the unchanged GET body then failed the PATCH); a name the owner uses is
    a form error (``OwnerValidatedForm``)."""

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        given = {k: v for k, v in data.items() if k in CHANGEABLE and v is not None}
        checked = MemoryBaseUpdateSerializer(data=given, context={"memory_base": self.instance})
        if not checked.is_valid():
            for field, errors in checked.errors.items():
                for error in errors:
                    self.add_error(field if field in self.fields else None, str(error))
        return data


CHANGEABLE = ("name", "threshold", "auto_capture", "preprocess", "preprocess_model",
              "preprocess_instructions", "preprocess_kill_phrase")  # fmt: skip


@admin.register(MemoryBase)
class MemoryBaseAdmin(admin.ModelAdmin):
    form = MemoryBaseForm
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
    # No filter sidebar: at 1440 px it pushed Last sync and Status off screen.
    search_fields = ["name", "owner__username", "flow__name"]
    fieldsets = [
        (None, {"fields": ["name", "owner", "flow", "knowledge_base", "kb_name", "created_at"]}),
        ("Capture", {"fields": ["threshold", "auto_capture"]}),
        (
            "Preprocessing",
            {
                "fields": [
                    "preprocess",
                    "preprocess_model",
                    "preprocess_instructions",
                    "preprocess_kill_phrase",
                ],
                "classes": ["collapse"],
            },
        ),
    ]
    # The owner, the flow and the knowledge base are fixed at creation (tenancy): shown
    # as names, never as raw ids to type.
    readonly_fields = ["owner", "flow", "knowledge_base", "kb_name", "created_at"]
    inlines = [MemoryBaseSessionInline]
    actions = ["sync_now", "regenerate", "delete_with_knowledge_base"]
    change_form_template = "admin/memory_bases/memorybase/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryBase]:
        return with_pending_total(with_counters(super().get_queryset(request)))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # created through the API, which also creates its knowledge base

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/sync/", view(self.sync_view), name="memory_bases_memorybase_sync"
            ),
            path(
                "<path:object_id>/regenerate/",
                view(self.regenerate_view),
                name="memory_bases_memorybase_regenerate",
            ),
            *super().get_urls(),
        ]

    @admin.display(description="sessions", ordering="session_count")
    def sessions_count(self, mb: MemoryBase) -> int:
        return mb.session_count

    @admin.display(description="pending", ordering="pending_total")
    def pending(self, mb: MemoryBase) -> int:
        return mb.pending_total

    @admin.display(description="processed", ordering="processed_total")
    def processed(self, mb: MemoryBase) -> int:
        return mb.processed_total

    @admin.display(description="chunks", ordering="chunk_total")
    def chunks(self, mb: MemoryBase) -> int:
        return mb.chunk_total

    @admin.display(description="last sync", ordering="last_sync")
    def last_sync(self, mb: MemoryBase) -> str:
        if mb.last_sync is None:
            return "never"
        return localtime(mb.last_sync).strftime("%Y-%m-%d %H:%M")

    @admin.display(description="status")
    def status(self, mb: MemoryBase) -> str:
        if mb.mismatch:
            return format_html(
                '<strong class="mismatch" style="color:#ba2121">⚠ {}</strong>', "Mismatch"
            )
        if mb.active_jobs:
            return f"syncing ({mb.active_jobs})"
        return "ok"

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        mb = self.get_queryset(request).filter(pk=object_id).first()
        extra = dict(extra_context or {})
        if mb is not None:
            if mb.mismatch and request.method == "GET":
                messages.warning(request, mismatch_text(mb))
            if mb.session_count > INLINE_SESSIONS:
                extra["sessions_note"] = (
                    f"The sessions below are the {INLINE_SESSIONS} synced last of "
                    f"{mb.session_count}: GET /api/v1/memory-bases/{mb.pk}/sessions lists all."
                )
            extra["counters"] = [
                ("Sessions", mb.session_count),
                ("Pending", mb.pending_total),
                ("Processed", mb.processed_total),
                ("Chunks", mb.chunk_total),
                ("Last sync", self.last_sync(mb)),
                ("Status", self.status(mb)),
            ]
        return super().change_view(request, object_id, form_url, extra)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if request.method == "GET":
            broken = list(
                with_counters(MemoryBase.objects.all())
                .filter(Q(mismatch=True))  # (an annotation: in SQL, not row by row)
                .values_list("name", flat=True)
            )
            if broken:
                messages.warning(
                    request,
                    f"Mismatch detected in {', '.join(broken)}: chunks of processed messages "
                    "are missing. Open it and press Regenerate (or select it and run "
                    "“Regenerate”).",
                )
        return super().changelist_view(request, extra_context)

    def delete_model(self, request: HttpRequest, obj: MemoryBase) -> None:
        memory_base_delete(memory_base=obj)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """Django's delete page, naming the knowledge base that goes with each memory
        base (``memory_base_delete``): it listed only the sessions and jobs."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        for mb in objs:
            kb = mb.knowledge_base
            deleted.append(f"Knowledge base: {kb.name} (and its {kb.chunk_count:,} chunks)")
        return deleted, counts, perms_needed, protected

    # --- the change page's buttons ------------------------------------------------------
    def _object_or_404(self, request: HttpRequest, object_id: str) -> MemoryBase:
        mb = self.get_object(request, object_id)
        if mb is None or not self.has_change_permission(request, mb):
            raise Http404("No such memory base.")
        return mb

    def _change_url(self, mb: MemoryBase) -> str:
        return reverse("admin:memory_bases_memorybase_change", args=[mb.pk])

    def sync_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        mb = self._object_or_404(request, object_id)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        self._run(request, [mb], memory_base_flush, SYNC_TEXTS)
        return HttpResponseRedirect(self._change_url(mb))

    def regenerate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        mb = self._object_or_404(request, object_id)
        if not is_confirmed(request):
            return confirmation_page(
                self,
                request,
                [mb],
                title="Regenerate this memory base?",
                consequences=REGENERATE_CONSEQUENCES,
                button="Yes, regenerate",
                cancel_url=self._change_url(mb),
            )
        self._run(request, [mb], memory_base_regenerate, REGENERATE_TEXTS)
        return HttpResponseRedirect(self._change_url(mb))

    # --- list actions -----------------------------------------------------------------
    @admin.action(
        description="Sync now (ingest pending messages, ignoring the threshold)",
        permissions=["change"],
    )
    def sync_now(self, request: HttpRequest, queryset: QuerySet[MemoryBase]) -> None:
        self._run(request, list(queryset), memory_base_flush, SYNC_TEXTS)

    @admin.action(
        description="Regenerate (clear the knowledge base and re-ingest everything)",
        permissions=["change"],
    )
    @confirm_first(
        title="Regenerate these memory bases?",
        consequences=REGENERATE_CONSEQUENCES,
        button="Yes, regenerate",
    )
    def regenerate(self, request: HttpRequest, queryset: QuerySet[MemoryBase]) -> None:
        self._run(request, list(queryset), memory_base_regenerate, REGENERATE_TEXTS)

    @admin.action(
        description="Delete selected memory bases and their knowledge bases",
        permissions=["delete"],
    )
    @confirm_first(
        title="Delete these memory bases?", consequences=DELETE_CONSEQUENCES, button="Yes, delete"
    )
    def delete_with_knowledge_base(
        self, request: HttpRequest, queryset: QuerySet[MemoryBase]
    ) -> None:
        names = []
        for mb in list(queryset):
            memory_base_delete(memory_base=mb)
            names.append(mb.name)
        self.message_user(request, f"Deleted {', '.join(names)} and their knowledge bases.")

    def _run(
        self,
        request: HttpRequest,
        memory_bases: list[MemoryBase],
        service: Any,
        texts: tuple[str, str],
    ) -> None:
        """One message per memory base and outcome: queued (success), nothing to do
        (info), or refused (error, saying why)."""
        queued_text, nothing_text = texts
        for mb in memory_bases:
            try:
                jobs = service(memory_base=mb)
            except ServiceError as exc:
                self.message_user(request, f"{mb.name}: not started, {exc}.", messages.ERROR)
                continue
            if jobs:
                text = queued_text.format(
                    name=mb.name, n=len(jobs), s="" if len(jobs) == 1 else "s"
                )
                self.message_user(request, text, messages.SUCCESS)
            else:
                self.message_user(request, nothing_text.format(name=mb.name), messages.INFO)


SYNC_TEXTS = (
    "{name}: sync started, {n} ingestion job{s} queued.",
    "{name}: nothing to sync, no session has pending messages.",
)
REGENERATE_TEXTS = (
    "{name}: regenerating, {n} job{s} queued.",
    "{name}: nothing to regenerate, no session has captured messages.",
)


@admin.register(MemoryBaseJob)
class MemoryBaseJobAdmin(admin.ModelAdmin):
    list_display = ["job", "memory_base", "session_id", "trigger", "state", "work", "created"]
    list_display_links = ["job"]
    list_filter = ["status", "trigger"]
    list_select_related = ["memory_base", "session"]
    raw_id_fields = ["memory_base", "session"]

    @admin.display(description="job", ordering="id")
    def job(self, obj: MemoryBaseJob) -> str:
        return str(obj.pk)[:8]

    @admin.display(description="status", ordering="status")
    def state(self, obj: MemoryBaseJob) -> str:
        """The status, and for a job waiting for its owner's budget, until when."""
        until = obj.deferred_until
        if (
            obj.status == MemoryBaseJob.Status.QUEUED
            and until is not None
            and until > timezone.now()
        ):
            return f"{obj.get_status_display()} until {until:%m-%d %H:%M} (budget)"
        return obj.get_status_display()

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: MemoryBaseJob) -> str:
        return f"{obj.created_at:%Y-%m-%d %H:%M}"

    @admin.display(description="session", ordering="session__session_id")
    def session_id(self, obj: MemoryBaseJob) -> str:
        """The session's id, a long one cut (the job's page has it whole)."""
        name = obj.session.session_id
        return name if len(name) <= 24 else name[:23] + "…"

    @admin.display(description="messages / chunks")
    def work(self, obj: MemoryBaseJob) -> str:
        return f"{obj.messages_processed:,} / {obj.chunks_written:,}"

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
