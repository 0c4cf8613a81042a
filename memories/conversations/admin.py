from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.admin import NoDjangoDeleteMixin, OwnerFixedAdmin
from memories.conversations.models import ConversationSummary, Flow, Message
from memories.conversations.summaries import summary_key_parts


@admin.register(Flow)
class FlowAdmin(NoDjangoDeleteMixin, OwnerFixedAdmin):  # (deleting would skip the erasure)
    list_display = ["name", "owner", "created_at"]
    list_select_related = ["owner"]
    search_fields = ["name", "owner__username"]
    autocomplete_fields = ["owner"]  # chosen by username


@admin.register(Message)
class MessageAdmin(NoDjangoDeleteMixin, admin.ModelAdmin):  # (erased through the API)
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


SUMMARY_FIELDS: tuple[str, ...] = (
    "owner",
    "where",
    "conversation",
    "text",
    "messages_summarized",
    "last_summarized_id",
    "summarized_ids",
    "token_count",
    "updated_at",
)


@admin.register(ConversationSummary)
class ConversationSummaryAdmin(admin.ModelAdmin):
    """Running conversation summaries (the context tier), readable; deleting one makes
    the next call of its conversation summarise again from the start."""

    list_display = ["where", "conversation", "owner", "messages_summarized",
                    "last_summarized_id", "token_count", "updated_at"]  # fmt: skip
    list_filter = ["owner"]
    list_select_related = ["owner"]
    search_fields = ["key", "text", "owner__username"]
    ordering = ["owner", "key"]
    fields = SUMMARY_FIELDS
    readonly_fields = SUMMARY_FIELDS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="scope or flow")
    def where(self, summary: ConversationSummary) -> str:
        return summary_key_parts(summary.key)[0]

    @admin.display(description="conversation")
    def conversation(self, summary: ConversationSummary) -> str:
        return summary_key_parts(summary.key)[1]

    @admin.display(description="messages summarised")
    def messages_summarized(self, summary: ConversationSummary) -> int:
        return len(summary.summarized_ids)
