from __future__ import annotations

from rest_framework import serializers

from core.api.fields import StrictCharField
from core.api.serializers import RefusingUnknown


class ToolCallSerializer(RefusingUnknown):
    """``scope`` (a list, possibly a template filled from ``scope_values``; the end-user
    header fills ``user_id``) is required by the memory tools, not by the node tools."""

    scope = serializers.ListField(
        child=serializers.JSONField(), min_length=1, max_length=8, required=False
    )
    scope_values = serializers.DictField(
        child=StrictCharField(max_length=255, allow_blank=True), required=False, default=dict
    )
    arguments = serializers.DictField(required=False, default=dict)


class ToolFunctionSerializer(serializers.Serializer):
    name = StrictCharField()
    description = StrictCharField()
    parameters = serializers.DictField(help_text="JSON Schema of the arguments")


class OpenAIToolSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["function"])
    function = ToolFunctionSerializer()


class ToolListSerializer(serializers.Serializer):
    tools = OpenAIToolSerializer(many=True)


class ToolCallOutputSerializer(serializers.Serializer):
    name = StrictCharField()
    scope = serializers.ListField(child=StrictCharField(), allow_null=True)
    result = serializers.DictField(help_text="The tool's answer (JSON)")
