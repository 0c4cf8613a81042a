from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from core.validation import SessionIdField
from ingestion.models import Flow, IngestionJob, MemoryBase, Message

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


class RunInSerializer(serializers.Serializer):
    session_id = SessionIdField()
    run_id = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
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
    run_id = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")


class MessageOutputSerializer(serializers.ModelSerializer):
    flow = serializers.UUIDField(source="flow_id")
    parent_message_id = serializers.IntegerField(source="parent_id", allow_null=True)

    class Meta:
        model = Message
        fields = [
            "id", "flow", "session_id", "run_id", "is_output", "role", "sender", "sender_name",
            "text", "content", "files", "parent_message_id", "created_at",
        ]  # fmt: skip


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


class MemoryBaseCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    flow = serializers.UUIDField()
    threshold = serializers.IntegerField(min_value=1, max_value=100000, default=10)
    auto_capture = serializers.BooleanField(default=True)
    kb_name = serializers.CharField(max_length=200, required=False)
    preprocess = serializers.BooleanField(default=False)
    preprocess_model = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )
    preprocess_instructions = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=10000
    )
    preprocess_kill_phrase = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )

    def validate_name(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Name may not be blank.")
        return value.strip()


class MemoryBaseUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    threshold = serializers.IntegerField(min_value=1, max_value=100000, required=False)
    auto_capture = serializers.BooleanField(required=False)
    preprocess = serializers.BooleanField(required=False)
    preprocess_model = serializers.CharField(max_length=200, required=False, allow_blank=True)
    preprocess_instructions = serializers.CharField(
        required=False, allow_blank=True, max_length=10000
    )
    preprocess_kill_phrase = serializers.CharField(max_length=200, required=False, allow_blank=True)


class MemoryBaseOutputSerializer(serializers.ModelSerializer):
    flow = serializers.UUIDField(source="flow_id")
    knowledge_base = serializers.UUIDField(source="knowledge_base_id")
    sessions = serializers.IntegerField(source="session_count")
    total_processed = serializers.IntegerField(source="processed_total")
    last_sync_at = serializers.DateTimeField(source="last_sync", allow_null=True)
    active_jobs = serializers.IntegerField()
    chunks = serializers.IntegerField(source="knowledge_base.chunk_count")
    mismatch = serializers.SerializerMethodField()

    class Meta:
        model = MemoryBase
        fields = [
            "id", "name", "flow", "threshold", "auto_capture", "knowledge_base", "kb_name",
            "preprocess", "preprocess_model", "preprocess_instructions", "preprocess_kill_phrase",
            "sessions", "total_processed", "last_sync_at", "active_jobs", "chunks", "mismatch",
            "created_at",
        ]  # fmt: skip

    def get_mismatch(self, mb: MemoryBase) -> bool:
        return bool(mb.has_processed and not mb.has_chunks)


class JobOutputSerializer(serializers.ModelSerializer):
    session_id = serializers.CharField(source="session.session_id")
    memory_base = serializers.UUIDField(source="memory_base_id")

    class Meta:
        model = IngestionJob
        fields = [
            "id", "memory_base", "session_id", "status", "trigger", "messages_processed",
            "chunks_written", "error", "created_at", "started_at", "finished_at",
        ]  # fmt: skip


class SessionOutputSerializer(serializers.Serializer):
    session_id = serializers.CharField()
    pending = serializers.IntegerField()
    total_processed = serializers.IntegerField()
    last_sync_at = serializers.DateTimeField(allow_null=True)
    active_job = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()

    def get_active_job(self, session: Any) -> dict[str, Any] | None:
        if session.active_job_id is None:
            return None
        return {"id": str(session.active_job_id), "status": session.active_job_status}

    def get_status(self, session: Any) -> str:
        if session.active_job_id is not None:
            return "syncing" if session.active_job_status == "running" else "queued"
        if session.last_job_status == "failed":
            return "failed"
        return "pending" if session.pending else "synced"


class FlushInSerializer(serializers.Serializer):
    session_id = SessionIdField(required=False)


class MessageQuerySerializer(serializers.Serializer):
    session_id = SessionIdField(required=False)
    memory_base_id = serializers.UUIDField(required=False)
    flow = serializers.UUIDField(required=False)
