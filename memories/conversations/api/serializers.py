from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from memories.conversations.history import DEFAULT_AI_PREFIX, DEFAULT_HUMAN_PREFIX, History
from memories.conversations.models import Flow, Message
from memories.conversations.node_memory import MESSAGE_ID_MAX

MAX_TOKENS_CEILING = 1_000_000
MESSAGE_LIMIT_CEILING = 10_000


FILE_TYPES = ("image", "audio", "video", "document", "custom")
TRANSFER_METHODS = ("local_file", "remote_url", "tool_file")


class FileRefSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=FILE_TYPES)
    transfer_method = serializers.ChoiceField(choices=TRANSFER_METHODS)
    upload_file_id = serializers.CharField(required=False, allow_null=True, max_length=200)
    tool_file_id = serializers.CharField(required=False, allow_null=True, max_length=200)
    url = serializers.URLField(required=False, allow_null=True, max_length=2000)
    belongs_to = serializers.ChoiceField(choices=("user", "assistant"), required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        needed = {"local_file": "upload_file_id", "tool_file": "tool_file_id", "remote_url": "url"}
        key = needed[attrs["transfer_method"]]
        if not attrs.get(key):
            raise serializers.ValidationError({key: f"Required for {attrs['transfer_method']}."})
        return attrs


def content_to_text(content: Any) -> tuple[str, list[dict[str, Any]]]:
    """A string, or OpenAI-style content blocks; returns (text, blocks)."""
    if isinstance(content, str):
        return content, []
    if isinstance(content, list) and all(isinstance(b, dict) and "type" in b for b in content):
        parts = [str(b.get("text", "")) for b in content if b["type"] == "text"]
        return "\n".join(p for p in parts if p), content
    raise serializers.ValidationError("Must be a string or a list of content blocks with a type.")


class MessageInSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Message.Role.choices)
    content = serializers.JSONField()
    is_output = serializers.BooleanField(required=False, allow_null=True, default=None)
    sender = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    sender_name = serializers.CharField(
        required=False, allow_blank=True, max_length=200, default=""
    )
    files = FileRefSerializer(many=True, required=False, default=list)
    parent_message_id = serializers.IntegerField(required=False, allow_null=True, min_value=1)

    def validate_content(self, value: Any) -> Any:
        text, _ = content_to_text(value)
        if not text.strip():
            raise serializers.ValidationError("Content has no text.")
        if len(text) > settings.MESSAGE_MAX_CHARS:
            raise serializers.ValidationError(
                f"Content is longer than {settings.MESSAGE_MAX_CHARS} characters."
            )
        return value


class MessageOutputSerializer(serializers.ModelSerializer):
    flow = serializers.UUIDField(source="flow_id")
    parent_message_id = serializers.IntegerField(source="parent_id", allow_null=True)

    class Meta:
        model = Message
        fields = [
            "id",
            "flow",
            "session_id",
            "run_id",
            "is_output",
            "role",
            "sender",
            "sender_name",
            "text",
            "content",
            "files",
            "parent_message_id",
            "created_at",
        ]


class FlowInSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)

    def validate_name(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Name may not be blank.")
        return value.strip()


class FlowOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Flow
        fields = ["id", "name", "created_at"]


def _default_max_tokens() -> int:
    return settings.HISTORY_MAX_TOKENS


def _default_message_limit() -> int:
    return settings.HISTORY_MESSAGE_LIMIT


class FlowQuerySerializer(serializers.Serializer):
    flow = serializers.UUIDField(help_text="A flow of the caller; another owner's flow is 404.")


class _HistoryQuerySerializer(FlowQuerySerializer):
    max_tokens = serializers.IntegerField(
        min_value=1, max_value=MAX_TOKENS_CEILING, default=_default_max_tokens
    )
    format = serializers.ChoiceField(choices=("messages", "text"), default="messages")
    human_prefix = serializers.CharField(
        max_length=50, default=DEFAULT_HUMAN_PREFIX, trim_whitespace=False
    )
    ai_prefix = serializers.CharField(
        max_length=50, default=DEFAULT_AI_PREFIX, trim_whitespace=False
    )


class ConversationHistoryQuerySerializer(_HistoryQuerySerializer):
    current_message_id = serializers.IntegerField(min_value=1, required=False)
    message_limit = serializers.IntegerField(
        min_value=1, max_value=MESSAGE_LIMIT_CEILING, default=_default_message_limit
    )


class NodeHistoryQuerySerializer(_HistoryQuerySerializer):
    current_message_id = serializers.CharField(max_length=MESSAGE_ID_MAX, required=False)


class NodeTurnInSerializer(FlowQuerySerializer):
    message_id = serializers.CharField(max_length=MESSAGE_ID_MAX)
    parent_message_id = serializers.CharField(
        max_length=MESSAGE_ID_MAX,
        required=False,
        allow_null=True,
        help_text="The turn this one follows. Omitted: the newest stored turn. "
        "null: starts a new thread (e.g. regenerating the first turn).",
    )
    user_content = serializers.CharField(allow_blank=True, trim_whitespace=False)
    user_files = FileRefSerializer(many=True, required=False, default=list)
    assistant_content = serializers.CharField(allow_blank=True, trim_whitespace=False)
    assistant_files = FileRefSerializer(many=True, required=False, default=list)

    def _bounded(self, value: str) -> str:
        if len(value) > settings.MESSAGE_MAX_CHARS:
            raise serializers.ValidationError(
                f"Content is longer than {settings.MESSAGE_MAX_CHARS} characters."
            )
        return value

    def validate_user_content(self, value: str) -> str:
        return self._bounded(value)

    def validate_assistant_content(self, value: str) -> str:
        return self._bounded(value)


class _HistoryItemSerializer(serializers.Serializer):
    role = serializers.CharField()
    content = serializers.CharField()
    files = serializers.ListField(child=serializers.DictField())
    token_count = serializers.IntegerField(help_text="Tokens of the content alone.")
    created_at = serializers.DateTimeField()


class ConversationItemSerializer(_HistoryItemSerializer):
    message_id = serializers.IntegerField()
    parent_message_id = serializers.IntegerField(allow_null=True)


class NodeItemSerializer(_HistoryItemSerializer):
    message_id = serializers.CharField()
    parent_message_id = serializers.CharField(allow_null=True)


class ChatMessageSerializer(serializers.Serializer):
    role = serializers.CharField()
    content = serializers.CharField()


class HistoryOutputSerializer(serializers.Serializer):
    """``messages`` (format=messages) or ``text`` (format=text), and the items."""

    format = serializers.SerializerMethodField()
    messages = ChatMessageSerializer(many=True, source="as_messages", required=False)
    text = serializers.SerializerMethodField()
    items = ConversationItemSerializer(many=True)
    token_count = serializers.IntegerField(
        help_text="count_message_tokens of the messages: 3 + per message 3 + role + content."
    )
    max_tokens = serializers.IntegerField()
    thread_length = serializers.IntegerField(help_text="Messages in the thread before the cut.")
    truncated = serializers.IntegerField(help_text="Oldest thread messages dropped.")

    def get_format(self, history: History) -> str:
        return self.context.get("format", "messages")

    def get_text(self, history: History) -> str:
        return history.as_text(
            human_prefix=self.context.get("human_prefix", DEFAULT_HUMAN_PREFIX),
            ai_prefix=self.context.get("ai_prefix", DEFAULT_AI_PREFIX),
        )

    def to_representation(self, history: History) -> dict[str, Any]:
        data = super().to_representation(history)
        data.pop("text" if data["format"] == "messages" else "messages")
        return data


class NodeHistoryOutputSerializer(HistoryOutputSerializer):
    items = NodeItemSerializer(many=True)  # type: ignore[assignment]  # node message ids are strings


class NodeTurnOutputSerializer(serializers.Serializer):
    message_id = serializers.CharField()
    parent_message_id = serializers.CharField(allow_null=True)
    created = serializers.BooleanField(help_text="False when this was a replay of a stored turn.")
    messages = NodeItemSerializer(many=True, source="items")
