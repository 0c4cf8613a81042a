from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join

from core.admin_confirm import confirm_first
from core.metrics import counter_values
from memories.facts.models import (
    EndUser,
    GlobalMemory,
    MemoryUpdate,
    UserVector,
    Vector,
)
from memories.facts.selectors import links_count
from memories.facts.services import end_user_erase, global_memory_create, global_memory_delete


class MemoryUpdateInline(admin.TabularInline):
    model = MemoryUpdate
    extra = 0
    can_delete = False
    fields = ["created_at", "action", "old_content", "new_content", "reason"]
    readonly_fields = tuple(fields)
    ordering = ["-created_at"]
    verbose_name_plural = "audit trail"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(EndUser)
class EndUserAdmin(admin.ModelAdmin):
    list_display = ["external_id", "owner", "memory_count", "last_seen_at", "created_at"]
    list_select_related = ["owner"]
    search_fields = ["external_id", "owner__username"]
    list_filter = ["owner"]
    readonly_fields = ["owner", "external_id", "created_at", "last_seen_at", "memories"]
    inlines = [MemoryUpdateInline]
    actions = ["erase"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[EndUser]:
        return super().get_queryset(request).annotate(_memories=Count("links"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="memories", ordering="_memories")
    def memory_count(self, end_user: EndUser) -> int:
        return end_user._memories  # type: ignore[attr-defined]  # annotated by get_queryset

    @admin.display(description="memories (links)")
    def memories(self, end_user: EndUser) -> str:
        links = (
            UserVector.objects.filter(end_user=end_user)
            .select_related("vector")
            .annotate(shared_with=Count("vector__links"))
            .order_by("-created_at")
        )
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    link.vector.content,
                    link.vector.observed_at,
                    link.created_at,
                    link.shared_with - 1,
                )
                for link in links
            ),
        )
        return format_html(
            "<table><thead><tr><th>memory</th><th>said at</th><th>linked at</th><th>shared with</th></tr>"
            "</thead><tbody>{}</tbody></table>",
            rows,
        )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        counters = [("memory_total_count", links_count()), *counter_values()]
        return super().changelist_view(
            request, {**(extra_context or {}), "memory_counters": counters}
        )

    @admin.action(description="Erase selected users (memories, links and audit trail)")
    @confirm_first(
        title="Erase these end users?",
        consequences=[
            "delete their memory links, the memories nobody else shares, their audit trail "
            "and the end users themselves (this cannot be undone).",
        ],
        button="Yes, erase",
    )
    def erase(self, request: HttpRequest, queryset: QuerySet[EndUser]) -> None:
        removed = sum(end_user_erase(end_user=end_user) for end_user in list(queryset))
        self.message_user(request, f"Erased; {removed} memory link(s) removed.")


class GlobalMemoryForm(forms.ModelForm):
    owner = forms.ModelChoiceField(queryset=get_user_model().objects.all())

    class Meta:
        model = GlobalMemory
        fields = ["owner", "content"]


@admin.register(GlobalMemory)
class GlobalMemoryAdmin(admin.ModelAdmin):
    form = GlobalMemoryForm
    list_display = ["content", "owner", "created_at"]
    list_select_related = ["owner"]
    search_fields = ["content", "owner__username"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Vector]:
        return super().get_queryset(request).filter(type=Vector.Type.GLOBAL).defer("embedding")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: GlobalMemory, form: Any, change: bool) -> None:
        created = global_memory_create(
            owner=form.cleaned_data["owner"], content=form.cleaned_data["content"]
        )
        obj.pk = created.pk

    def delete_model(self, request: HttpRequest, obj: GlobalMemory) -> None:
        global_memory_delete(vector=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Vector]) -> None:
        for vector in queryset:
            global_memory_delete(vector=vector)


@admin.register(MemoryUpdate)
class MemoryUpdateAdmin(admin.ModelAdmin):
    list_display = ["created_at", "end_user", "action", "old_content", "new_content", "reason"]
    list_filter = ["action"]
    list_select_related = ["end_user"]
    search_fields = ["end_user__external_id", "old_content", "new_content", "reason"]
    raw_id_fields = ["end_user"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
