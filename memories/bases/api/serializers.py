from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.fields import StrictBooleanField, StrictCharField, StrictIntegerField
from core.api.serializers import JOB_FIELDS, JobOutputBase, refuse_changes, refuse_unknown
from core.validation import SessionIdField
from memories.bases.models import MemoryBase, MemoryBaseJob
from memories.bases.selectors import session_status


class MemoryBaseCreateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=200)
    flow = serializers.UUIDField()
    threshold = StrictIntegerField(min_value=1, max_value=100000, default=10)
    auto_capture = StrictBooleanField(default=True)
    kb_name = StrictCharField(max_length=200, required=False)
    preprocess = StrictBooleanField(default=False)
    preprocess_model = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
    preprocess_instructions = StrictCharField(
        required=False, allow_blank=True, default="", max_length=10000
    )
    preprocess_kill_phrase = StrictCharField(
        max_length=200, required=False, allow_blank=True, default=""
    )

    def validate_name(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Name may not be blank.")
        return value.strip()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_unknown(self.initial_data, self.fields)
        return attrs


# The answer's computed fields: a GET body sent back unchanged passes (refuse_changes).
READ_ONLY_MB_FIELDS = ("id", "sessions", "total_processed", "last_sync_at", "active_jobs",
                       "chunks", "mismatch", "created_at")  # fmt: skip


class MemoryBaseUpdateSerializer(serializers.Serializer):
    """Needs ``context={"memory_base": mb}``."""

    name = StrictCharField(max_length=200, required=False)
    threshold = StrictIntegerField(min_value=1, max_value=100000, required=False)
    auto_capture = StrictBooleanField(required=False)
    preprocess = StrictBooleanField(required=False)
    preprocess_model = StrictCharField(max_length=200, required=False, allow_blank=True)
    preprocess_instructions = StrictCharField(required=False, allow_blank=True, max_length=10000)
    preprocess_kill_phrase = StrictCharField(max_length=200, required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        mb: MemoryBase = self.context["memory_base"]
        refuse_changes(
            self.initial_data,
            changeable=self.fields,
            fixed={
                "flow": mb.flow_id,
                "knowledge_base": mb.knowledge_base_id,
                "kb_name": mb.kb_name,
            },
            ignored=READ_ONLY_MB_FIELDS,
            why_fixed="{key} cannot be changed after the memory base is created: create a "
            "new memory base for another flow or knowledge base.",
            unknown="Unknown field {key}.",
        )
        return attrs


class MemoryBaseOutputSerializer(serializers.ModelSerializer):
    flow = serializers.UUIDField(source="flow_id")
    knowledge_base = serializers.UUIDField(source="knowledge_base_id")
    sessions = StrictIntegerField(source="session_count")
    total_processed = StrictIntegerField(source="processed_total")
    last_sync_at = serializers.DateTimeField(source="last_sync", allow_null=True)
    active_jobs = StrictIntegerField()
    chunks = StrictIntegerField(source="chunk_total", help_text="Rows in the chunk table.")
    mismatch = serializers.BooleanField()

    class Meta:
        model = MemoryBase
        fields = [
            "id",
            "name",
            "flow",
            "threshold",
            "auto_capture",
            "knowledge_base",
            "kb_name",
            "preprocess",
            "preprocess_model",
            "preprocess_instructions",
            "preprocess_kill_phrase",
            "sessions",
            "total_processed",
            "last_sync_at",
            "active_jobs",
            "chunks",
            "mismatch",
            "created_at",
        ]


class JobOutputSerializer(JobOutputBase):
    KIND = "memory_base_sync"
    session_id = StrictCharField(source="session.session_id")
    memory_base = serializers.UUIDField(source="memory_base_id")

    class Meta:
        model = MemoryBaseJob
        fields = [
            *JOB_FIELDS,
            "memory_base",
            "session_id",
            "trigger",
            "messages_processed",
            "chunks_written",
            "deferred_until",
        ]


class SessionOutputSerializer(serializers.Serializer):
    session_id = StrictCharField()
    pending = StrictIntegerField()
    total_processed = StrictIntegerField()
    last_sync_at = serializers.DateTimeField(allow_null=True)
    active_job = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()

    def get_active_job(self, session: Any) -> dict[str, Any] | None:
        if session.active_job_id is None:
            return None
        return {"id": str(session.active_job_id), "status": session.active_job_status}

    def get_status(self, session: Any) -> str:
        return session_status(session)


class FlushInSerializer(serializers.Serializer):
    session_id = SessionIdField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_unknown(self.initial_data, self.fields)
        return attrs
