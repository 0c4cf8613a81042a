from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.fields import StrictBooleanField, StrictCharField
from core.validation import SessionIdField
from memories.stores.models import STAGES, MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.registry import store_type
from memories.stores.services import backend_for


class StoreCreateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100)
    type = StrictCharField(max_length=64)
    config = serializers.JSONField(required=False, default=dict)


class StoreUpdateSerializer(serializers.Serializer):
    config = serializers.JSONField()


class StoreOutputSerializer(serializers.ModelSerializer):
    items = serializers.SerializerMethodField()
    read_only = serializers.SerializerMethodField()  # type: ignore[assignment]
    embedding = serializers.SerializerMethodField()
    knowledge_base = serializers.UUIDField(source="knowledge_base_id", allow_null=True)

    class Meta:
        model = MemoryStore
        fields = [
            "id",
            "name",
            "type",
            "config",
            "items",
            "read_only",
            "embedding",
            "knowledge_base",
            "created_at",
            "updated_at",
        ]

    def get_items(self, store: MemoryStore) -> int:
        kind = store_type(store.type)
        counted = backend_for(store).item_count() if kind else None
        return counted if counted is not None else int(getattr(store, "own_items", 0))

    def get_read_only(self, store: MemoryStore) -> bool:
        kind = store_type(store.type)
        return bool(kind and kind.read_only)

    def get_embedding(self, store: MemoryStore) -> dict[str, Any] | None:
        if not store.embedding_provider:
            return None
        return {
            "provider": store.embedding_provider,
            "model": store.embedding_model,
            "dimensions": store.embedding_dimensions,
            "source": "config" if store.has_own_embedding else "default",
        }


class ItemOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = MemoryItem
        fields = [
            "id",
            "content_summary",
            "input_snapshot",
            "output_snapshot",
            "metadata",
            "session_id",
            "created_at",
        ]


class ItemQuerySerializer(serializers.Serializer):
    session_id = SessionIdField(required=False)


class AttachmentOutputSerializer(serializers.ModelSerializer):
    name = StrictCharField(source="store.name")
    type = StrictCharField(source="store.type")

    class Meta:
        model = MemoryAttachment
        fields = [
            "name",
            "type",
            "retrieve_stage",
            "top_k",
            "similarity_threshold",
            "read",
            "write",
        ]


class RetrieveInSerializer(serializers.Serializer):
    stage = serializers.ChoiceField(STAGES)
    query = StrictCharField(allow_blank=True, max_length=20_000, trim_whitespace=False)
    session_id = SessionIdField(required=False, default="")
    max_tokens = serializers.IntegerField(min_value=20, max_value=100_000, required=False)


class HitOutputSerializer(serializers.Serializer):
    id = StrictCharField()
    content = StrictCharField()
    score = serializers.FloatField(allow_null=True)
    similarity = serializers.FloatField(allow_null=True)
    metadata = serializers.JSONField()
    created_at = serializers.DateTimeField(allow_null=True)


class StoreHitsOutputSerializer(serializers.Serializer):
    store = StrictCharField()
    type = StrictCharField()
    in_prompt = serializers.IntegerField()
    hits = HitOutputSerializer(many=True)


class RetrieveOutputSerializer(serializers.Serializer):
    stage = StrictCharField()
    stores = StoreHitsOutputSerializer(many=True)
    prompt = StrictCharField()
    token_count = serializers.IntegerField()
    max_tokens = serializers.IntegerField()
    truncated = serializers.BooleanField()


class WriteInSerializer(serializers.Serializer):
    input = serializers.JSONField(help_text="A string or {text, blocks}")
    output = serializers.JSONField(help_text="A string or {text, blocks}")
    metadata = serializers.DictField(required=False, default=dict)
    session_id = SessionIdField(required=False, default="")


class WriteOutputSerializer(serializers.Serializer):
    store = StrictCharField()
    type = StrictCharField()
    action = StrictCharField(source="result.action")
    item_id = serializers.IntegerField(source="result.item_id", allow_null=True)
    reason = StrictCharField(source="result.reason")
    trimmed = serializers.IntegerField(source="result.trimmed")


class ConfigQuerySerializer(serializers.Serializer):
    dry_run = StrictBooleanField(required=False, default=False)
