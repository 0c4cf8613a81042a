from __future__ import annotations

import unicodedata
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.fields import StrictBooleanField, StrictCharField, StrictIntegerField
from core.api.serializers import OPENAI_MESSAGE_KEYS, RefusingUnknown
from memories.conversations.history import (
    DEFAULT_AI_PREFIX,
    DEFAULT_HUMAN_PREFIX,
    IMAGE_BLOCK_TYPES,
    MESSAGE_LIMIT_MAX,
    History,
)
from memories.conversations.models import MESSAGE_ID_MAX, UUID_NIL, Flow, Message
from memories.conversations.services import PREVIOUS

MAX_TOKENS_CEILING = 1_000_000


FILE_TYPES = ("image", "audio", "video", "document", "custom")
TRANSFER_METHODS = ("local_file", "remote_url", "tool_file")


class FileRefSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=FILE_TYPES)
    transfer_method = serializers.ChoiceField(choices=TRANSFER_METHODS)
    upload_file_id = StrictCharField(required=False, allow_null=True, max_length=200)
    tool_file_id = StrictCharField(required=False, allow_null=True, max_length=200)
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
        parts = [b.get("text") for b in content if b["type"] == "text"]
        if not all(isinstance(p, str) for p in parts):  # (null or an object is no text)
            raise serializers.ValidationError("A text block's text must be a string.")
        return "\n".join(p for p in parts if p), content
    raise serializers.ValidationError("Must be a string or a list of content blocks with a type.")


class MessageIdField(StrictCharField):
    def __init__(self, **kwargs: Any):
        super().__init__(max_length=MESSAGE_ID_MAX, **kwargs)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": MESSAGE_ID_MAX},
            {"type": "integer", "minimum": 1},
        ],
        "nullable": True,
    }
)
class ParentMessageIdField(serializers.Field):
    """A message id of either kind: the caller's ``message_id`` (a string) or the
    server id (an integer). Dify's ``UUID_NIL`` means "no parent: follows the
    previous message", as an omitted parent does; ``null`` starts a new thread."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool) and data >= 1:
            return data
        if isinstance(data, str) and data.strip() and len(data) <= MESSAGE_ID_MAX:
            return PREVIOUS if data == UUID_NIL else data
        raise serializers.ValidationError(
            f"Must be a message id: the id you gave the message (a string of at most "
            f"{MESSAGE_ID_MAX} characters) or the server's id (a positive integer)."
        )

    def to_representation(self, value: Any) -> Any:
        return value


def validate_message_content(role: str, content: Any) -> None:
    """Text or an image; an assistant message may be exactly ``""`` (an answer still
    being generated, left out of histories)."""
    text, blocks = content_to_text(content)
    for block in blocks:
        if block["type"] == "image_url" and not _image_url(block.get("image_url")):
            raise serializers.ValidationError({"content": [
                'An image_url block needs "image_url": {"url": ...} with an http, https or '
                "data URL."]})  # fmt: skip
    has_image = any(block.get("type") in IMAGE_BLOCK_TYPES for block in blocks)
    pending = role == Message.Role.ASSISTANT and text == "" and not blocks
    if not text.strip() and not has_image and not pending:
        raise serializers.ValidationError({"content": ["Content has no text or image."]})
    if len(text) > settings.MESSAGE_MAX_CHARS:
        raise serializers.ValidationError(
            {"content": [f"Content is longer than {settings.MESSAGE_MAX_CHARS} characters."]}
        )


def _image_url(value: Any) -> bool:
    """OpenAI's ``image_url`` object (a replayed history's image is sent to a model as
    it is: one without a URL, or with a ``javascript:`` one, no provider takes)."""
    url = value.get("url") if isinstance(value, dict) else None
    return isinstance(url, str) and url.split(":", 1)[0].lower() in ("http", "https", "data")


class MessageInSerializer(RefusingUnknown):
    """A message of a run. OpenAI's tool-calling steps (an assistant message with
    ``tool_calls`` and no text, its ``content`` null or empty; a ``tool`` message with a
    ``tool_call_id``, the call's result) validate with ``tool_step`` set: a run passes
    them over, so its history keeps the question and the final answer (a text-less
    assistant message would read as an answer being generated and take its question
    out of the history, and a tool message without the call it answers is no valid
    OpenAI history)."""

    passed_over = OPENAI_MESSAGE_KEYS

    role = serializers.ChoiceField(choices=Message.Role.choices)
    content = serializers.JSONField(allow_null=True)
    tool_calls = serializers.ListField(child=serializers.DictField(), required=False,
                                       allow_null=True, allow_empty=True)  # fmt: skip
    tool_call_id = StrictCharField(required=False, allow_null=True, allow_blank=True)
    message_id = MessageIdField(
        required=False,
        help_text="Your id for the message, unique within the conversation; history "
        "items carry it, and parent_message_id / current_message_id may name it.",
    )
    is_output = StrictBooleanField(required=False, allow_null=True, default=None)
    sender = StrictCharField(required=False, allow_blank=True, max_length=100, default="")
    sender_name = StrictCharField(required=False, allow_blank=True, max_length=200, default="")
    files = FileRefSerializer(many=True, required=False, default=list)
    parent_message_id = ParentMessageIdField(
        help_text="The message this one follows: your message_id or the server id. "
        "Omitted (or 00000000-0000-0000-0000-000000000000): the message recorded just "
        "before. null: the message starts a new thread."
    )

    def validate_content(self, value: Any) -> Any:
        if value is not None:  # (null: a tool call's, checked in validate)
            content_to_text(value)
        return value

    def validate_message_id(self, value: Any) -> Any:
        if value == UUID_NIL:  # (named here, where the body's path to it is known)
            raise serializers.ValidationError(f"may not be {UUID_NIL} (it means 'no parent').")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        role, content = attrs["role"], attrs["content"]
        calls = attrs.pop("tool_calls", None) and role == Message.Role.ASSISTANT
        answered = attrs.pop("tool_call_id", None) and role == Message.Role.TOOL
        if content is None and not calls:
            raise serializers.ValidationError({"content": ["This field may not be null."]})
        attrs["content"] = content = "" if content is None else content
        text, blocks = content_to_text(content)
        attrs["tool_step"] = bool(answered or (calls and not text.strip() and not blocks))
        if not attrs["tool_step"]:
            validate_message_content(role, content)
        return attrs


class MessageOutputSerializer(serializers.ModelSerializer):
    flow = serializers.UUIDField(source="flow_id")
    message_id = serializers.SerializerMethodField(
        help_text="Your message_id when you gave one, else the server id (as history items)."
    )
    parent_message_id = serializers.SerializerMethodField(
        help_text="The parent's message_id when it has one, else its server id."
    )

    class Meta:
        model = Message
        fields = [
            "id",
            "message_id",
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
            "starts_thread",
            "created_at",
        ]

    @extend_schema_field(serializers.JSONField())
    def get_message_id(self, message: Message) -> int | str:
        return message.message_id or message.pk

    def get_parent_message_id(self, message: Message) -> int | str | None:
        caller_id = getattr(message, "parent_caller_id", None)
        return caller_id or message.parent_id

    def to_representation(self, instance: Message) -> Any:
        """``content`` is always the message's blocks: a message sent as a plain string
        answers that string as one text block (not ``[]`` beside its ``text``)."""
        data = super().to_representation(instance)
        if not data["content"] and instance.text:
            data["content"] = [{"type": "text", "text": instance.text}]
        return data


class FlowInSerializer(RefusingUnknown):
    name = StrictCharField(max_length=200)

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


class FlowQuerySerializer(serializers.Serializer):
    flow = serializers.UUIDField(help_text="A flow of the caller; another owner's flow is 404.")


class _HistoryQuerySerializer(FlowQuerySerializer):
    max_tokens = StrictIntegerField(
        min_value=1, max_value=MAX_TOKENS_CEILING, default=_default_max_tokens
    )
    format = serializers.ChoiceField(choices=("messages", "text"), default="messages")
    human_prefix = StrictCharField(
        max_length=50, default=DEFAULT_HUMAN_PREFIX, trim_whitespace=False
    )
    ai_prefix = StrictCharField(max_length=50, default=DEFAULT_AI_PREFIX, trim_whitespace=False)

    def _one_line(self, value: str) -> str:
        # (a line break in a prefix writes lines into the transcript no one said)
        if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in value):
            raise serializers.ValidationError("A prefix may not hold a line break or control "
                                              "character.")  # fmt: skip
        return value

    def validate_human_prefix(self, value: str) -> str:
        return self._one_line(value)

    def validate_ai_prefix(self, value: str) -> str:
        return self._one_line(value)


class ConversationHistoryQuerySerializer(_HistoryQuerySerializer):
    current_message_id = MessageIdField(
        required=False, help_text="Your message_id or the server id (default: the newest)."
    )
    message_limit = StrictIntegerField(
        min_value=0,
        default=0,
        help_text=f"Newest messages considered; 0: HISTORY_MESSAGE_LIMIT; at most "
        f"{MESSAGE_LIMIT_MAX} (larger values are clamped).",
    )
    strategy = serializers.ChoiceField(
        choices=("truncate", "summarize"),
        default="truncate",
        help_text="truncate: the oldest messages are dropped. summarize: they are folded "
        "into the conversation's running summary (an LLM call when it grows).",
    )
    max_tokens_before_summary = StrictIntegerField(
        min_value=16, max_value=MAX_TOKENS_CEILING, required=False,
        help_text="summarize: fold once the history passes this (default max_tokens).",
    )  # fmt: skip
    max_summary_tokens = StrictIntegerField(
        min_value=1, max_value=MAX_TOKENS_CEILING, default=256,
        help_text="summarize: the summary's size limit.",
    )  # fmt: skip


class NodeHistoryQuerySerializer(_HistoryQuerySerializer):
    current_message_id = StrictCharField(max_length=MESSAGE_ID_MAX, required=False)


class NodeTurnInSerializer(RefusingUnknown, FlowQuerySerializer):
    message_id = StrictCharField(max_length=MESSAGE_ID_MAX)
    parent_message_id = StrictCharField(
        max_length=MESSAGE_ID_MAX,
        required=False,
        allow_null=True,
        help_text="The turn this one follows. Omitted (or "
        "00000000-0000-0000-0000-000000000000, Dify's 'no parent'): the newest stored turn. "
        "null: starts a new thread (e.g. regenerating the first turn).",
    )
    user_content = StrictCharField(allow_blank=True, trim_whitespace=False)
    user_files = FileRefSerializer(many=True, required=False, default=list)
    assistant_content = StrictCharField(allow_blank=True, trim_whitespace=False)
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

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("parent_message_id") == UUID_NIL:  # as a run's messages read it
            del attrs["parent_message_id"]
        empty = {f"{side}_content": ["Content has no text or file."]
                 for side in ("user", "assistant")
                 if not attrs[f"{side}_content"].strip() and not attrs[f"{side}_files"]}  # fmt: skip
        if empty:  # (a turn is a question and its answer: an empty one is neither)
            raise serializers.ValidationError(empty)
        return attrs


class _HistoryItemSerializer(serializers.Serializer):
    role = StrictCharField()
    content = StrictCharField()
    files = serializers.ListField(child=serializers.DictField())
    token_count = StrictIntegerField(help_text="Tokens of the content alone.")
    created_at = serializers.DateTimeField()


class ConversationItemSerializer(_HistoryItemSerializer):
    id = StrictIntegerField(help_text="The server id.")
    message_id = serializers.JSONField(help_text="Your message_id, else the server id.")
    parent_message_id = serializers.JSONField(
        help_text="The parent's message_id, else its server id; null without a parent."
    )


class NodeItemSerializer(_HistoryItemSerializer):
    message_id = StrictCharField()
    parent_message_id = StrictCharField(allow_null=True)


class ChatMessageSerializer(serializers.Serializer):
    role = StrictCharField()
    content = serializers.JSONField(help_text="The text, or content blocks with an image.")


@extend_schema_field({"type": "string", "description": "format=text only: the transcript."})
class _HistoryText(serializers.Field):
    """A history as one text (``format=text``): not read-only, so the schema can say it is
    not always there (drf-spectacular lists a read-only field as required)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(source="*", required=False, **kwargs)

    def to_representation(self, history: Any) -> str:
        context = self.parent.context
        return str(history.as_text(
            human_prefix=context.get("human_prefix", DEFAULT_HUMAN_PREFIX),
            ai_prefix=context.get("ai_prefix", DEFAULT_AI_PREFIX),
        ))  # fmt: skip


class HistoryOutputSerializer(serializers.Serializer):
    """``messages`` (format=messages) or ``text`` (format=text), and the items."""

    format = serializers.SerializerMethodField()
    messages = ChatMessageSerializer(many=True, source="as_messages", required=False)
    text = _HistoryText()
    items = ConversationItemSerializer(many=True)
    token_count = StrictIntegerField(
        help_text="count_message_tokens of the messages: 3 + per message 3 + role + content."
    )
    max_tokens = StrictIntegerField()
    thread_length = StrictIntegerField(
        help_text="Messages in the thread before the cut (pending answers left out)."
    )
    truncated = StrictIntegerField(help_text="Oldest thread messages dropped.")

    def get_format(self, history: History) -> str:
        return self.context.get("format", "messages")

    def to_representation(self, history: History) -> dict[str, Any]:
        data = super().to_representation(history)
        data.pop("text" if data["format"] == "messages" else "messages")
        return data


class ConversationHistoryOutputSerializer(HistoryOutputSerializer):
    message_limit = StrictIntegerField(help_text="The message_limit applied.")


class RunningSummarySerializer(serializers.Serializer):
    text = StrictCharField(source="summary")
    summarized_message_ids = serializers.ListField(child=StrictCharField(), source="summarized_ids")
    last_summarized_message_id = StrictCharField(source="last_summarized_id")
    folded_now = serializers.ListField(child=StrictCharField(), source="folded")
    llm_calls = StrictIntegerField()


class SummarizedHistoryOutputSerializer(ConversationHistoryOutputSerializer):
    """strategy=summarize: ``messages`` start with the running summary (a system
    message); ``items`` are the messages kept verbatim."""

    strategy = serializers.SerializerMethodField()
    summary = RunningSummarySerializer()

    def get_strategy(self, history: Any) -> str:
        return "summarize"


class ConversationHistoryAnswerSerializer(ConversationHistoryOutputSerializer):
    """Schema only: what a conversation's history answers; ``strategy`` and ``summary``
    only with strategy=summarize (``SummarizedHistoryOutputSerializer``)."""

    strategy = serializers.ChoiceField(choices=["summarize"], required=False)
    summary = RunningSummarySerializer(required=False)


class NodeHistoryOutputSerializer(HistoryOutputSerializer):
    items = NodeItemSerializer(many=True)  # type: ignore[assignment]  # node message ids are strings


class NodeTurnOutputSerializer(serializers.Serializer):
    message_id = StrictCharField()
    parent_message_id = StrictCharField(allow_null=True)
    created = serializers.BooleanField(help_text="False when this was a replay of a stored turn.")
    messages = NodeItemSerializer(many=True, source="items")
