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
