"""The engine's request bodies. A fact, a hit and a search's filter have the facts
room's one shape and vocabulary (``memories.facts.api.serializers``), re-exported."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from core.api.fields import MetadataField, StrictCharField, StrictFloatField, StrictIntegerField
from core.api.serializers import refuse_unknown
from memories.facts.api.serializers import (
    AliasesMixin,
    AtFieldsMixin,
    DecisionSerializer,
    FactFilterSerializer,
    FactOutputSerializer,
    FactSearchSerializer,
    FactUpdateSerializer,
    HitSerializer,
    SearchOutputSerializer,
    ValidityFieldsMixin,
    take_at,
    take_validity,
)
from memories.facts.models import CATEGORIES, SOURCE_KINDS
from memories.facts.services import MAX_FACT_CHARS

__all__ = [
    "DecisionSerializer", "FactCreateSerializer", "FactFilterSerializer", "FactOutputSerializer",
    "FactUpdateSerializer", "HitSerializer", "InjectionSerializer", "ScopedSerializer",
    "SearchOutputSerializer", "SearchSerializer", "user_header_value",
]  # fmt: skip


class ScopedSerializer(serializers.Serializer):
    """``scope`` (a list, possibly a template such as ``["memories", "{user_id}"]``) and
    the ``scope_values`` that fill it (the end-user header fills ``user_id``)."""

    scope = serializers.ListField(child=serializers.JSONField(), min_length=1, max_length=8)
    scope_values = serializers.DictField(
        child=StrictCharField(max_length=255, allow_blank=True), required=False, default=dict
    )

    def to_internal_value(self, data: Any) -> Any:
        # A key that names no field is a 400 naming it: "confidance": 0.3 stored the fact
        # at confidence 1.0, where 0.3 was below the threshold (nothing stored), and a
        # misspelt "fliter" searched everything.
        refuse_unknown(data, self.fields)
        return super().to_internal_value(data)


class FactCreateSerializer(AliasesMixin, ValidityFieldsMixin, ScopedSerializer):
    aliases = {"text": "content"}

    content = StrictCharField(max_length=MAX_FACT_CHARS, required=False)
    text = StrictCharField(
        max_length=MAX_FACT_CHARS, required=False, help_text="Another name for content."
    )
    category = serializers.ChoiceField(choices=CATEGORIES, default="context")
    confidence = StrictFloatField(min_value=0, max_value=1, default=1.0)
    source_kind = serializers.ChoiceField(choices=SOURCE_KINDS, default="api")
    source_ref = StrictCharField(max_length=255, required=False, default="", allow_blank=True)
    metadata = MetadataField()
    reason = StrictCharField(max_length=1000, required=False, default="", allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if not attrs.get("content"):
            raise serializers.ValidationError({"content": "This field is required."})
        return take_validity(attrs)


@extend_schema_serializer(component_name="EngineSearch")
class SearchSerializer(ScopedSerializer, FactSearchSerializer):
    pass


class InjectionSerializer(AtFieldsMixin, ScopedSerializer):
    max_tokens = StrictIntegerField(min_value=1, max_value=100_000)
    query = StrictCharField(max_length=10_000, required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return take_at(super().validate(attrs))


def user_header_value(request: Any) -> str | None:
    return request.headers.get(settings.MEMORY_USER_HEADER) or None
