from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.fields import CHAT_ROLES, StrictBooleanField, StrictCharField
from memories.facts.models import MemoryUpdate, Vector
from memories.facts.services import MAX_MEMORY_CHARS


class MemoryOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Vector
        fields = ["id", "content", "type", "metadata", "observed_at", "created_at"]


class MemoryHitSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    content = StrictCharField()
    type = StrictCharField()
    similarity = serializers.FloatField()
    score = serializers.FloatField()
    observed_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()


class InputMessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=CHAT_ROLES)
    content = StrictCharField(max_length=100_000)


class MemoryAddSerializer(serializers.Serializer):
    content = StrictCharField(
        required=False, max_length=100_000, help_text="The text to learn from (or store)."
    )
    text = StrictCharField(
        required=False, max_length=100_000, help_text="Another name for content."
    )
    messages = InputMessageSerializer(  # type: ignore[call-arg]  # ListSerializer takes it
        many=True, required=False, allow_empty=False, max_length=200
    )
    infer = StrictBooleanField(default=True)
    metadata = serializers.DictField(required=False, default=dict)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "content" in attrs:
            if "text" in attrs and attrs["text"] != attrs["content"]:
                raise serializers.ValidationError(
                    {"content": "Give content or text (the same field), not both."}
                )
            attrs["text"] = attrs.pop("content")
        if bool(attrs.get("text", "").strip()) == bool(attrs.get("messages")):
            raise serializers.ValidationError(
                {"content": "Give either a non-empty content or messages."}
            )
        if not attrs["infer"]:
            texts = (
                [attrs["text"]]
                if attrs.get("text")
                else [m["content"] for m in attrs["messages"] if m["role"] == "user"]
            )
            if not texts:
                raise serializers.ValidationError({"messages": "No user message to store."})
            for text in texts:
                if len(text.strip()) > MAX_MEMORY_CHARS:
                    raise serializers.ValidationError(
                        {
                            "content": f"A memory stored as given is at most "
                            f"{MAX_MEMORY_CHARS} characters."
                        }
                    )
            attrs["texts"] = texts
        return attrs


class MemoryUpdateSerializer(serializers.Serializer):
    content = StrictCharField(max_length=MAX_MEMORY_CHARS)


class MemorySearchSerializer(serializers.Serializer):
    q = StrictCharField(max_length=10_000)
    top_k = serializers.IntegerField(min_value=1, max_value=100, default=10)
    threshold = serializers.FloatField(min_value=-1, max_value=1, required=False)
    half_life_days = serializers.FloatField(min_value=0.001, required=False)
    include_globals = StrictBooleanField(required=False, default=False)


class GlobalMemoryInSerializer(serializers.Serializer):
    content = StrictCharField(max_length=MAX_MEMORY_CHARS)


class MemoryAddResultSerializer(serializers.Serializer):
    """Schema only: memories stored as given, those that were already stored, and the
    ids of the user's memories trimmed by ``ENGINE_MAX_FACTS`` to make room."""

    memories = MemoryOutputSerializer(many=True)
    duplicates = MemoryOutputSerializer(many=True)
    evicted = serializers.ListField(child=serializers.UUIDField())


class HistorySerializer(serializers.ModelSerializer):
    class Meta:
        model = MemoryUpdate
        fields = [
            "id",
            "action",
            "old_vector",
            "new_vector",
            "old_content",
            "new_content",
            "reason",
            "created_at",
        ]


class DecisionSerializer(serializers.Serializer):
    fact = StrictCharField()
    action = StrictCharField()
    reason = StrictCharField()
    target_id = StrictCharField(allow_null=True)
    memory_id = StrictCharField(allow_null=True)
