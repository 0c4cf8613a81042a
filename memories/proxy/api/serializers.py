"""What the OpenAI-compatible proxy validates of a request, and the models list."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from core.api.fields import CHAT_ROLES, StrictBooleanField, StrictCharField, StrictIntegerField


@extend_schema_serializer(component_name="ChatCompletionMessage")
class ChatMessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=CHAT_ROLES)
    content = serializers.JSONField(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        content = attrs.get("content")
        if content is None and attrs["role"] not in ("assistant", "tool", "function"):
            raise serializers.ValidationError({"content": "Required for this role."})
        if content is not None and not isinstance(content, str | list):
            raise serializers.ValidationError(
                {"content": "Must be a string or a list of content parts."}
            )
        if isinstance(content, list) and not all(
            isinstance(p, dict) and "type" in p for p in content
        ):
            raise serializers.ValidationError({"content": "Each content part needs a type."})
        return attrs


class ChatCompletionSerializer(serializers.Serializer):
    """Validates what the proxy relies on; every other field passes through unchanged."""

    model = StrictCharField(max_length=200, required=False)
    messages = ChatMessageSerializer(many=True, allow_empty=False)
    stream = StrictBooleanField(required=False, default=False)
    # The end user's id when no header names one: checked as one (400 invalid_user, as
    # the header's), so its length is not refused here with another code.
    user = StrictCharField(required=False, allow_blank=True)
    memory_tools = StrictBooleanField(
        required=False, allow_null=True,
        help_text="This service's own field (never sent upstream): true offers the model "
        "manage_memory and search_memory, which the proxy runs itself (needs an end user); "
        "false keeps them off where the owner's setting turns them on.",
    )  # fmt: skip

    def validate_model(self, value: str) -> str:
        if not isinstance(self.initial_data.get("model"), str):
            raise serializers.ValidationError("Must be a string.")
        return value

    def validate_messages(self, value: list[Any]) -> list[Any]:
        if len(value) > settings.RUN_MAX_MESSAGES:
            raise serializers.ValidationError(f"At most {settings.RUN_MAX_MESSAGES} messages.")
        return value


class ModelEntrySerializer(serializers.Serializer):
    id = StrictCharField()
    object = StrictCharField()
    created = StrictIntegerField(required=False)
    owned_by = StrictCharField(required=False)


class ModelListSerializer(serializers.Serializer):
    object = StrictCharField()
    data = ModelEntrySerializer(many=True)  # type: ignore[assignment]  # the field is named data


# The chat completion a proxy door answers (schema only): the upstream's answer as it
# sent it, whatever members it has, plus this service's own (memories.proxy.chat).
_NUMBER_OR_NULL = {"type": "number", "nullable": True}
INJECTED_MEMORY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A fact the memory block held (memories.proxy.chat.InjectedMemory): "
    "relevant ones (found by the search, with score and similarity) first, then the ones "
    "that filled the block's budget by confidence.",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "content": {"type": "string"},
        "category": {"type": "string"},
        "confidence": {"type": "number"},
        "type": {"type": "string", "enum": ["memory", "global"]},
        "relevant": {"type": "boolean"},
        "score": _NUMBER_OR_NULL,
        "similarity": _NUMBER_OR_NULL,
    },
    "required": ["id", "content", "category", "confidence", "type", "relevant", "score",
                 "similarity"],
}  # fmt: skip
MEMORY_TOOL_CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A memory tool call the proxy ran: its arguments (the text sent, when it "
    "was no JSON object), and its result or the error the model was told.",
    "properties": {
        "name": {"type": "string", "nullable": True},
        "arguments": {"oneOf": [{"type": "object"}, {"type": "string"}]},
        "result": {"type": "object"},
        "error": {"type": "string"},
    },
    "required": ["name"],
}
CHAT_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "OpenAI's chat completion as the upstream sent it (every member kept), "
    "plus memories (the facts the memory block held: none without an end user) and, "
    "when the proxy offered memory tools, memory_tool_calls.",
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": "object", "nullable": True},
        "memories": {"type": "array", "items": INJECTED_MEMORY_SCHEMA},
        "memory_tool_calls": {"type": "array", "items": MEMORY_TOOL_CALL_SCHEMA},
    },
    "additionalProperties": True,
}
