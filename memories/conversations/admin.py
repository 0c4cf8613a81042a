from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from memories.conversations.models import Flow, Message


@admin.register(Flow)
class FlowAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "created_at"]
    list_select_related = ["owner"]
    search_fields = ["name", "owner__username"]
    autocomplete_fields = ["owner"]  # chosen by username


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "flow",
        "session_id",
        "run_id",
        "role",
        "is_output",
        "excerpt",
        "created_at",
    ]
    list_filter = ["role", "is_output"]
    list_select_related = ["flow"]
    search_fields = ["=session_id", "=run_id", "flow__name"]
    readonly_fields = ["owner"]
    raw_id_fields = ["flow", "parent"]
    show_full_result_count = False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="text")
    def excerpt(self, message: Message) -> str:
        return message.text[:100] + ("…" if len(message.text) > 100 else "")
