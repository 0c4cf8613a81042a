from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from core.api.fields import StrictCharField
from core.api.serializers import RefusingUnknown
from core.validation import SessionIdField
from memories.conversations.api.serializers import MessageInSerializer


class RunInSerializer(RefusingUnknown):
    session_id = SessionIdField()
    run_id = StrictCharField(max_length=64, required=False, allow_blank=True, default="")
    messages = MessageInSerializer(many=True, allow_empty=False)

    def validate_messages(self, value: list[Any]) -> list[Any]:
        if len(value) > settings.RUN_MAX_MESSAGES:
            raise serializers.ValidationError(
                f"At most {settings.RUN_MAX_MESSAGES} messages per run."
            )
        return value


class SingleMessageInSerializer(MessageInSerializer):
    flow = serializers.UUIDField()
    session_id = SessionIdField()
    run_id = StrictCharField(max_length=64, required=False, allow_blank=True, default="")


class MessageQuerySerializer(serializers.Serializer):
    session_id = SessionIdField(required=False)
    memory_base_id = serializers.UUIDField(required=False)
    flow = serializers.UUIDField(required=False)
