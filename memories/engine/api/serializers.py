from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from core.api.fields import StrictCharField
from memories.facts.facts import SOURCE_KINDS
from memories.facts.models import CATEGORIES, Vector
from memories.facts.services import MAX_MEMORY_CHARS


class ScopedSerializer(serializers.Serializer):
    """``scope`` (a list, possibly a template such as ``["memories", "{user_id}"]``) and
    the ``scope_values`` that fill it (the end-user header fills ``user_id``)."""

    scope = serializers.ListField(child=serializers.JSONField(), min_length=1, max_length=8)
    scope_values = serializers.DictField(
        child=StrictCharField(max_length=255, allow_blank=True), required=False, default=dict
    )


class FactCreateSerializer(ScopedSerializer):
    content = StrictCharField(max_length=MAX_MEMORY_CHARS)
    category = serializers.ChoiceField(choices=CATEGORIES, default="context")
    confidence = serializers.FloatField(min_value=0, max_value=1, default=1.0)
    source_kind = serializers.ChoiceField(choices=SOURCE_KINDS, default="api")
    source_ref = StrictCharField(max_length=255, required=False, default="", allow_blank=True)
    reason = StrictCharField(max_length=1000, required=False, default="", allow_blank=True)


class FactUpdateSerializer(serializers.Serializer):
    content = StrictCharField(max_length=MAX_MEMORY_CHARS, required=False)
    category = serializers.ChoiceField(choices=CATEGORIES, required=False)
    confidence = serializers.FloatField(min_value=0, max_value=1, required=False)
    reason = StrictCharField(max_length=1000, required=False, default="edited")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not {"content", "category", "confidence"} & set(attrs):
            raise serializers.ValidationError(
                {"content": "Give at least one of content, category, confidence."}
            )
        return attrs


class FactFilterSerializer(serializers.Serializer):
    category = serializers.ListField(
        child=serializers.ChoiceField(choices=CATEGORIES), required=False, min_length=1
    )
    min_confidence = serializers.FloatField(min_value=0, max_value=1, required=False)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("category"), str):
            data = {**data, "category": [data["category"]]}
        return super().to_internal_value(data)


@extend_schema_serializer(component_name="EngineSearch")
class SearchSerializer(ScopedSerializer):
    query = StrictCharField(max_length=10_000)
    limit = serializers.IntegerField(min_value=1, max_value=100, default=10)
    offset = serializers.IntegerField(min_value=0, max_value=10_000, default=0)
    filter = FactFilterSerializer(required=False)
    half_life_days = serializers.FloatField(min_value=0, required=False)


class InjectionSerializer(ScopedSerializer):
    max_tokens = serializers.IntegerField(min_value=1, max_value=100_000)
    query = StrictCharField(max_length=10_000, required=False, allow_blank=True)


def _with_source(data: dict[str, Any], obj: Any) -> dict[str, Any]:
    # "source" is an attribute of every DRF field, so it is added here, not declared.
    return {**data, "source": {"kind": obj.source_kind, "ref": obj.source_ref}}


class FactOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Vector
        fields = [
            "id", "content", "category", "confidence", "observed_at", "created_at", "updated_at",
        ]  # fmt: skip

    def to_representation(self, instance: Vector) -> dict[str, Any]:
        return _with_source(super().to_representation(instance), instance)


class DecisionSerializer(serializers.Serializer):
    content = StrictCharField()
    action = StrictCharField()
    reason = StrictCharField(allow_blank=True)
    fact_id = StrictCharField(allow_null=True)
    target_id = StrictCharField(allow_null=True)
    match = StrictCharField(allow_null=True)
    similarity = serializers.FloatField(allow_null=True)
    evicted_ids = serializers.ListField(child=StrictCharField())


@extend_schema_serializer(component_name="EngineHit")
class HitSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    content = StrictCharField()
    category = StrictCharField()
    confidence = serializers.FloatField()
    score = serializers.FloatField()
    similarity = serializers.FloatField(allow_null=True)
    keyword_score = serializers.FloatField(allow_null=True)
    observed_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def to_representation(self, instance: Any) -> dict[str, Any]:
        return _with_source(super().to_representation(instance), instance)


def user_header_value(request: Any) -> str | None:
    return request.headers.get(settings.MEMORY_USER_HEADER) or None
