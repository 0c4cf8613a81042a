from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from core.admin import ReadOnlyAdmin, ScopePathSearchMixin, model_permission
from core.admin_confirm import confirm_first
from core.metrics import counter_values
from memories.facts.models import (
    Fact,
    FactChange,
    FactLink,
    FactVersion,
    GlobalMemory,
    Scope,
)
from memories.facts.scopes import global_scope_ensure
from memories.facts.selectors import links_count
from memories.facts.services import MAX_FACT_CHARS, FactIn, fact_add, fact_delete, scope_erase


class FactChangeInline(admin.TabularInline):
    model = FactChange
    extra = 0
    can_delete = False
    fields = ["created_at", "action", "old_content", "new_content", "reason"]
    readonly_fields = tuple(fields)
    ordering = ["-created_at"]
    verbose_name_plural = "audit trail"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Scope)
class ScopeAdmin(ScopePathSearchMixin, admin.ModelAdmin):
    list_display = ["scope_path", "owner", "memory_count", "last_seen_at", "created_at"]
    list_display_links = ["scope_path"]
    list_select_related = ["owner"]
    search_fields = ["external_id", "owner__username"]
    ordering = ["owner__username", "path"]  # (a stable order to page through)
    list_filter = ["owner"]
    # The scope written one way (user/alice), not the array's "user, alice".
    fields = ["owner", "scope_path", "external_id", "created_at", "last_seen_at", "memories"]
    readonly_fields = tuple(fields)
    inlines = [FactChangeInline]
    actions = ["erase"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Scope]:
        return super().get_queryset(request).annotate(_memories=Count("links"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A scope goes only through its erasure (the ``erase`` action: ``scope_erase``),
        # never by Django's delete, which would leave its facts, chats and engine data
        # behind and the audit trail of access without the event.
        return False

    def has_erase_permission(self, request: HttpRequest) -> bool:
        """The ``erase`` action's: the model's delete permission (Django's delete itself
        is refused above)."""
        return model_permission(self, request, "delete")

    @admin.display(description="path", ordering="path")
    def scope_path(self, scope: Scope) -> str:
        # The name alone is ambiguous: user/alice and agent/alice are two scopes.
        return "/".join(scope.path) or "(global)"

    @admin.display(description="memories", ordering="_memories")
    def memory_count(self, scope: Scope) -> int:
        return scope._memories  # type: ignore[attr-defined]  # annotated by get_queryset

    @admin.display(description="memories (links)")
    def memories(self, scope: Scope) -> str:
        links = (
            FactLink.objects.filter(scope=scope)
            .select_related("fact")
            .annotate(shared_with=Count("fact__links"))
            .order_by("-created_at")
        )
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            '<td><a href="{}?q={}">history</a></td></tr>',
            (
                (
                    link.fact.content,
                    f"{link.fact.observed_at:%Y-%m-%d %H:%M}",
                    f"{link.created_at:%Y-%m-%d %H:%M}",
                    link.shared_with - 1,
                    reverse("admin:memories_factversion_changelist"),
                    link.fact_id,
                )
                for link in links
            ),
        )
        return format_html(
            "<table><thead><tr><th>memory</th><th>said at</th><th>linked at</th><th>shared with</th>"
            "<th>earlier versions</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        counters = [("memory_total_count", links_count()), *counter_values()]
        return super().changelist_view(
            request, {**(extra_context or {}), "memory_counters": counters}
        )

    @admin.action(
        description="Erase selected scopes (memories, links and audit trail)",
        permissions=["erase"],
    )
    @confirm_first(
        title="Erase these scopes?",
        consequences=[
            "delete their memory links, the memories nobody else shares, their audit trail "
            "and the scopes themselves (this cannot be undone).",
        ],
        button="Yes, erase",
    )
    def erase(self, request: HttpRequest, queryset: QuerySet[Scope]) -> None:
        # The admin request is the actor of each erasure's audit event (core.audit).
        removed = sum(scope_erase(scope=scope) for scope in list(queryset))
        self.message_user(request, f"Erased; {removed} memory link(s) removed.")


class GlobalMemoryForm(forms.ModelForm):
    owner = forms.ModelChoiceField(queryset=get_user_model().objects.all())

    class Meta:
        model = GlobalMemory
        fields = ["owner", "content"]

    def clean_content(self) -> str:
        content = self.cleaned_data["content"]
        if len(content) > MAX_FACT_CHARS:  # (the write service's limit: it was a 500)
            raise forms.ValidationError(f"At most {MAX_FACT_CHARS:,} characters.")
        return content


@admin.register(GlobalMemory)
class GlobalMemoryAdmin(admin.ModelAdmin):
    """The owners' global memories (the facts of their global scopes), added and
    deleted through the write service as through ``/api/v1/global-memories``."""

    form = GlobalMemoryForm
    list_display = ["content", "owner", "created_at"]
    list_select_related = ["owner"]
    search_fields = ["content", "owner__username"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Fact]:
        return super().get_queryset(request).filter(scope__path=[]).defer("embedding")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: GlobalMemory, form: Any, change: bool) -> None:
        owner = form.cleaned_data["owner"]
        [decision] = fact_add(
            owner=owner, scope=global_scope_ensure(owner=owner), reason="added in the admin",
            facts=[FactIn(form.cleaned_data["content"], source_kind="api", source_ref="admin")],
        )  # fmt: skip
        obj.pk = decision.fact_id
        obj._decision = decision  # type: ignore[attr-defined]  # (for response_add)

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: Any = None) -> Any:
        """A text the global memories hold already (word for word or in meaning) is not
        added: said so, where Django would say "added successfully"."""
        decision = getattr(obj, "_decision", None)
        if decision is not None and decision.action != "add":
            self.message_user(
                request,
                f"Not added ({decision.action}): the global memories already hold it.",
                messages.WARNING,
            )
            return HttpResponseRedirect(reverse("admin:memories_globalmemory_changelist"))
        return super().response_add(request, obj, post_url_continue)

    def delete_model(self, request: HttpRequest, obj: Fact) -> None:
        fact_delete(
            owner=obj.owner_id, fact_id=obj.pk, scope=obj.scope, reason="deleted in the admin",
            source={"kind": "admin", "user": request.user.get_username()},
        )  # fmt: skip

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Fact]) -> None:
        for fact in queryset:
            self.delete_model(request, fact)


@admin.register(FactVersion)
class FactVersionAdmin(ReadOnlyAdmin):
    """A fact's earlier versions (read only): what the service believed, when, and the
    change that closed each. Searching a fact's id lists its own closed versions and the
    ones it replaced."""

    list_display = ["recorded_to", "scope", "content", "action", "reason", "closed_by",
                    "recorded_from", "valid_from", "valid_to"]  # fmt: skip
    list_filter = ["action", "superseded"]
    list_select_related = ["scope"]
    search_fields = ["=fact_id", "=successor_id", "content"]
    ordering = ["-recorded_to"]
    exclude = ["embedding"]
    verbose_name_plural = "fact versions (history)"

    @admin.display(description="source")
    def closed_by(self, version: FactVersion) -> str:
        source = version.source or {}
        return " ".join(str(v) for v in (source.get("kind"), source.get("ref") or
                                         source.get("user")) if v)  # fmt: skip


@admin.register(FactChange)
class FactChangeAdmin(ScopePathSearchMixin, admin.ModelAdmin):
    scope_path_lookup = "scope__path"
    list_display = ["created_at", "scope", "action", "old_content", "new_content", "reason"]
    ordering = ["-created_at", "-id"]  # the audit in time order, the newest first
    list_filter = ["action"]
    list_select_related = ["scope"]
    search_fields = ["scope__external_id", "old_content", "new_content", "reason"]
    raw_id_fields = ["scope"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
