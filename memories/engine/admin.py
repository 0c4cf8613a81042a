"""Admin for the engine's background tiers: the pending updates, the dreams (undo is an
action), each scope's journal (shown and downloadable) and dream-now action, and the
per-owner switches. Actions call the same services as the API."""

from __future__ import annotations

from datetime import date
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from core.admin import OwnerFixedAdmin, ReadOnlyAdmin, ScopePathSearchMixin, model_permission
from core.admin_confirm import confirm_first
from core.errors import ServiceError
from memories.engine import files
from memories.engine.api.background import markdown_download
from memories.engine.dreams import dream_run, dream_undo, memory_md_read
from memories.engine.models import (
    Dream,
    EngineFact,
    EngineSettings,
    FormationRun,
    PendingUpdate,
    ScopeJournal,
)


@admin.register(PendingUpdate)
class PendingUpdateAdmin(ScopePathSearchMixin, admin.ModelAdmin):
    scope_path_lookup = "scope__path"
    list_display = ["id", "scope_label", "owner", "status", "source", "when", "attempts",
                    "outcome"]  # fmt: skip
    list_filter = ["status", "source"]
    list_select_related = ["scope", "owner"]
    search_fields = ["scope__external_id", "owner__username", "batch_id"]
    raw_id_fields = ["scope", "owner"]
    readonly_fields = [f.name for f in PendingUpdate._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # (every field is the service's: Save changed nothing, said it did)

    @admin.display(description="scope", ordering="scope__path")
    def scope_label(self, update: PendingUpdate) -> str:
        label = update.scope.label
        return label if len(label) <= 32 else label[:31] + "…"  # (whole on its page)

    @admin.display(description="due / processed", ordering="due_at")
    def when(self, update: PendingUpdate) -> str:
        if update.processed_at is not None:
            return f"processed {update.processed_at:%Y-%m-%d %H:%M}"
        return f"due {update.due_at:%Y-%m-%d %H:%M:%S}"

    @admin.display(description="outcome")
    def outcome(self, update: PendingUpdate) -> str:
        """What the run learned (done), or why its answer could not be read (malformed)
        or the provider failed."""
        return (update.error or update.note)[:120]


@admin.register(FormationRun)
class FormationRunAdmin(ScopePathSearchMixin, admin.ModelAdmin):
    """Each update run and how it ended (what the index's formation health counts)."""

    scope_path_lookup = "scope__path"

    list_display = ["created_at", "scope", "owner", "status", "updates", "facts_learned"]
    list_filter = ["status"]
    list_select_related = ["scope", "owner"]
    search_fields = ["scope__external_id", "owner__username", "batch_id"]
    raw_id_fields = ["scope", "owner"]
    readonly_fields = [f.name for f in FormationRun._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # (every field is the service's: Save changed nothing, said it did)


def _table(head: list[str], rows: Any) -> str:
    """Rows as an HTML table (escaped), for the read-only pages."""
    body = format_html_join("", "<tr>{}</tr>", (
        (format_html_join("", "<td>{}</td>", ((cell,) for cell in row)),) for row in rows
    ))  # fmt: skip
    header = format_html_join("", "<th>{}</th>", ((h,) for h in head))
    return format_html("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", header, body)


def _after(change: dict[str, Any]) -> str:
    """A dream's change as it left the fact: its new text, or, for an update of the
    category or confidence alone (the cells were empty), what changed."""
    after = change.get("content") or (change.get("after") or {}).get("content")
    if after:
        return str(after)
    before = change.get("before") or {}
    moved = [f"{key}: {before.get(key)} → {value}"
             for key, value in (change.get("after") or {}).items() if before.get(key) != value]  # fmt: skip
    return "; ".join(moved)


@admin.register(Dream)
class DreamAdmin(ScopePathSearchMixin, admin.ModelAdmin):
    scope_path_lookup = "scope__path"
    list_display = [
        "created_at",
        "scope",
        "owner",
        "status",
        "trigger",
        "change_count",
        "llm_calls",
    ]
    list_filter = ["status", "trigger"]
    list_select_related = ["scope", "owner"]
    search_fields = ["scope__external_id", "owner__username"]
    raw_id_fields = ["scope", "owner"]
    # Read as a page, not a form: the facts before and the changes as tables.
    fields = [
        "scope_path", "owner", "status", "trigger", "created_at", "undone_at", "lookback_days",
        "days_read", "llm_calls", "changes_table", "facts_table", "diary",
        "memory_md_before", "memory_md_after",
    ]  # fmt: skip
    readonly_fields = tuple(fields)
    actions = ["undo"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:  # fmt: skip
        dream = self.get_object(request, object_id)
        title = (
            f"Dream of {dream.scope.label} on {dream.created_at:%Y-%m-%d %H:%M}" if dream else ""
        )
        return super().change_view(request, object_id, form_url,
                                   {**(extra_context or {}), "title": title})  # fmt: skip

    @admin.display(description="scope")
    def scope_path(self, dream: Dream) -> str:
        return dream.scope.label

    @admin.display(description="journal days read")
    def days_read(self, dream: Dream) -> str:
        return ", ".join(dream.journal_days) or "none"

    @admin.display(description="changes")
    def change_count(self, dream: Dream) -> int:
        return len(dream.changes)

    @admin.display(description="changes it made")
    def changes_table(self, dream: Dream) -> str:
        rows = (
            (c.get("action", ""), (c.get("before") or {}).get("content", ""), _after(c),
             c.get("result") or ("update" if c.get("action") == "update" else ""))
            for c in dream.changes
        )  # fmt: skip
        return _table(["action", "before", "after", "result"], rows)

    @admin.display(description="facts before the dream")
    def facts_table(self, dream: Dream) -> str:
        rows = ((f.get("content", ""), f.get("category", ""), f"{f.get('confidence', 0):.2f}",
                 f.get("source_kind", ""), (f.get("observed_at") or "")[:16].replace("T", " "))
                for f in dream.facts_before)  # fmt: skip
        return _table(["fact", "category", "confidence", "source", "said at"], rows)

    @admin.action(
        description="Undo the selected dreams (facts and MEMORY.md restored)",
        permissions=["change"],
    )
    @confirm_first(
        title="Undo these dreams?",
        consequences=[
            "put back the facts each dream dropped or rewrote, and remove the ones it added,",
            "restore the scope's MEMORY.md as it was before the dream.",
            "Facts learned after a dream stay. Only a scope's latest dream can be undone.",
        ],
        button="Yes, undo",
    )
    def undo(self, request: HttpRequest, queryset: QuerySet[Dream]) -> None:
        for dream in queryset.order_by("-created_at"):  # latest first: each is then the latest
            try:
                dream_undo(owner=dream.owner_id, dream_id=dream.pk)
                self.message_user(request, f"Undid dream {dream.pk}.")
            except ServiceError as exc:
                self.message_user(request, f"Dream {dream.pk}: {exc}", level=messages.ERROR)


@admin.register(ScopeJournal)
class ScopeJournalAdmin(ScopePathSearchMixin, admin.ModelAdmin):
    list_display = ["scope_path", "owner", "created_at"]
    list_display_links = ["scope_path"]
    list_select_related = ["owner"]
    search_fields = ["external_id", "owner__username"]
    list_filter = ["owner"]
    fields = ("owner", "path", "journal", "memory_md")
    readonly_fields = fields
    actions = ["dream_now"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a view of the scope's files; the actions call the services

    def has_dream_permission(self, request: HttpRequest) -> bool:
        return model_permission(self, request, "change")

    @admin.display(description="scope", ordering="path")
    def scope_path(self, scope: ScopeJournal) -> str:
        return "/".join(scope.path)

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(self.journal_view)
        return [path("<int:pk>/journal/<str:day>/", view, name="memory_engine_journal_day"),
                *super().get_urls()]  # fmt: skip

    def journal_view(self, request: HttpRequest, pk: int, day: str) -> HttpResponse:
        """One journal day as Markdown: shown in the browser, or ``?download=1``."""
        scope = self.get_object(request, str(pk))
        if scope is None or not self.has_view_permission(request, scope):
            return HttpResponse(status=404)
        try:
            text = files.journal_read(
                owner_id=scope.owner_id, scope=scope.path, day=files.parse_day(day)
            )
        except ServiceError:
            return HttpResponse(status=404)
        if request.GET.get("download"):
            return markdown_download(text, f"journal-{'-'.join(scope.path)}-{day}.md")
        return HttpResponse(text, content_type="text/plain; charset=utf-8")

    @admin.display(description="journal days")
    def journal(self, scope: ScopeJournal) -> str:
        days: list[date] = files.journal_days(owner_id=scope.owner_id, scope=scope.path)
        if not days:
            return "no journal yet"

        def link(day: date, download: bool) -> str:
            url = reverse("admin:memory_engine_journal_day", args=[scope.pk, day.isoformat()])
            return url + ("?download=1" if download else "")

        return format_html_join(
            "", '<div class="journal-day">{} · <a href="{}">show</a> · <a href="{}">download</a></div>',
            ((d.isoformat(), link(d, False), link(d, True)) for d in days),
        )  # fmt: skip

    @admin.display(description="MEMORY.md")
    def memory_md(self, scope: ScopeJournal) -> str:
        return format_html("<pre>{}</pre>", memory_md_read(scope))  # rendered now

    @admin.action(description="Dream now (consolidate the selected scopes)", permissions=["dream"])
    def dream_now(self, request: HttpRequest, queryset: QuerySet[ScopeJournal]) -> None:
        for scope in queryset.select_related("owner"):
            named = f"{scope.owner.username} · {scope}"  # (owners' scopes alike: "(global)")
            try:
                outcome = dream_run(owner=scope.owner_id, scope=scope, trigger=Dream.Trigger.ADMIN)
            except ServiceError as exc:
                self.message_user(request, f"{named}: {exc}", level=messages.ERROR)
                continue
            done = (
                "unchanged, skipped" if outcome.skipped else f"{len(outcome.dream.changes)} changes"
            )
            self.message_user(request, f"{named}: dream {outcome.dream.pk} ({done}).")


@admin.register(EngineFact)
class EngineFactAdmin(ScopePathSearchMixin, ReadOnlyAdmin):
    """The core facts of every scope, read only (they change through the write service:
    the API, the tools, the updates and dreams); a fact's earlier versions are linked."""

    scope_path_lookup = "scope__path"

    list_display = ["content", "scope_label", "category", "confidence", "source", "said"]
    list_filter = ["category", "source_kind"]
    list_select_related = ["scope", "owner"]
    search_fields = ["content", "owner__username", "scope__external_id"]
    ordering = ["-updated_at", "id"]
    fields = [
        "id", "content", "scope_label", "owner", "category", "confidence", "source",
        "observed_at", "valid_from", "valid_to", "created_at", "updated_at", "history",
    ]  # fmt: skip
    readonly_fields = tuple(fields)

    def get_queryset(self, request: HttpRequest) -> QuerySet[EngineFact]:
        return super().get_queryset(request).defer("embedding")

    @admin.display(description="scope", ordering="scope__path")
    def scope_label(self, fact: EngineFact) -> str:
        return fact.scope.label if fact.scope is not None else "(shared)"

    @admin.display(description="source")
    def source(self, fact: EngineFact) -> str:
        ref = fact.source_ref if len(fact.source_ref) <= 24 else fact.source_ref[:23] + "…"
        return f"{fact.source_kind} {ref}".strip()

    @admin.display(description="said at", ordering="observed_at")
    def said(self, fact: EngineFact) -> str:
        return f"{fact.observed_at:%Y-%m-%d %H:%M}"

    @admin.display(description="history")
    def history(self, fact: EngineFact) -> str:
        url = reverse("admin:memories_factversion_changelist")
        return format_html('<a href="{}?q={}">earlier versions</a>', url, fact.pk)


@admin.register(EngineSettings)
class EngineSettingsAdmin(OwnerFixedAdmin):
    list_display = ["owner", "dream_schedule", "memory_tools", "updated_at"]
    list_select_related = ["owner"]
    list_editable = ["dream_schedule", "memory_tools"]
    raw_id_fields = ["owner"]
