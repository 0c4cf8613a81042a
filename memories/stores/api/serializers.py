from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.fields import (
    MetadataField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)
from core.api.serializers import RefusingUnknown, refuse_changes
from core.validation import SessionIdField
from knowledge.models import Chunk
from memories.stores.models import STAGES, MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.registry import store_type
from memories.stores.services import backend_for, memory_store_problem


class StoreCreateSerializer(RefusingUnknown):
    name = StrictCharField(max_length=100)
    type = StrictCharField(max_length=64)
    config = serializers.JSONField(required=False, default=dict)


class StoreUpdateSerializer(serializers.Serializer):
    """A PATCH: the config changes; a store's name and type are its identity (a node
    attaches it by name), so another name or type is a 400, not a silent no-op."""

    config = serializers.JSONField()

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        # Before the fields: {"name": "renamed"} alone was a 400 "config: This field is
        # required.", which named the wrong thing to fix.
        if isinstance(data, Mapping):
            try:
                self._refuse_fixed(data)
            except serializers.ValidationError as exc:  # (validate()'s errors are lists)
                raise serializers.ValidationError(serializers.as_serializer_error(exc)) from None
        return super().to_internal_value(data)

    def _refuse_fixed(self, data: Mapping[str, Any]) -> None:
        store: MemoryStore = self.context["store"]
        refuse_changes(
            data,
            changeable=self.fields,
            fixed={"id": store.pk, "name": store.name, "type": store.type},
            ignored=set(StoreOutputSerializer.Meta.fields) | {"load"},
            why_fixed="{key} cannot be changed: create a store under the new {key} and "
            "attach it in the node's place (docs/memory-stores.md).",
            unknown="Unknown field {key}.",
        )


class StoreOutputSerializer(serializers.ModelSerializer):
    items = serializers.SerializerMethodField()
    read_only = serializers.SerializerMethodField()  # type: ignore[assignment]
    embedding = serializers.SerializerMethodField()
    knowledge_base = serializers.UUIDField(source="knowledge_base_id", allow_null=True)
    problem = serializers.SerializerMethodField(
        help_text="Why the store cannot answer now (an unset ${VAR}...); null when healthy. "
        "A node's retrieve and write name such a store in errors and answer without it."
    )

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
            "problem",
            "created_at",
            "updated_at",
        ]

    @extend_schema_field(StrictCharField(allow_null=True))
    def get_problem(self, store: MemoryStore) -> str | None:
        return memory_store_problem(store=store) if store_type(store.type) else "unknown type"

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
    """A store's item; a file store's items are the chunks of its files (its text as
    ``content_summary``, its file and place in ``metadata``, no snapshots)."""

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

    def to_representation(self, instance: Any) -> Any:
        if isinstance(instance, Chunk):
            return {
                "id": instance.pk, "content_summary": instance.text, "input_snapshot": {},
                "output_snapshot": {}, "session_id": "",
                "metadata": {**instance.metadata, "file_path": instance.file_path,
                             "chunk_index": instance.chunk_index,
                             "chunk_total": instance.chunk_total},
                "created_at": serializers.DateTimeField().to_representation(instance.created_at),
            }  # fmt: skip
        return super().to_representation(instance)


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


class RetrieveInSerializer(RefusingUnknown):
    stage = serializers.ChoiceField(STAGES)
    query = StrictCharField(allow_blank=True, max_length=20_000, trim_whitespace=False)
    session_id = SessionIdField(required=False, default="")
    max_tokens = StrictIntegerField(min_value=20, max_value=100_000, required=False)


class HitOutputSerializer(serializers.Serializer):
    id = StrictCharField(help_text="The store's id of the hit (any store type's).")
    item_id = serializers.SerializerMethodField(
        help_text="The item's id as the items API and a write name it (an integer), when "
        "the hit is an item of the store; null otherwise."
    )

    @extend_schema_field(StrictIntegerField(allow_null=True))
    def get_item_id(self, hit: Any) -> int | None:
        return int(hit.id) if str(hit.id).isdigit() else None

    content = StrictCharField()
    score = StrictFloatField(allow_null=True)
    similarity = StrictFloatField(allow_null=True)
    metadata = serializers.JSONField()
    created_at = serializers.DateTimeField(allow_null=True)


class StoreHitsOutputSerializer(serializers.Serializer):
    store = StrictCharField()
    type = StrictCharField()
    in_prompt = StrictIntegerField()
    hits = HitOutputSerializer(many=True)


class StoreErrorSerializer(serializers.Serializer):
    """A store that could not answer; the node's other stores answered without it."""

    store = StrictCharField()
    type = StrictCharField()
    code = StrictCharField()
    message = StrictCharField()


class RetrieveOutputSerializer(serializers.Serializer):
    stage = StrictCharField()
    stores = StoreHitsOutputSerializer(many=True)
    prompt = StrictCharField()
    token_count = StrictIntegerField()
    max_tokens = StrictIntegerField()
    truncated = StrictIntegerField(
        help_text="Hits left out of the prompt by max_tokens (0: none), as a history's "
        "truncated counts the messages it left out."
    )
    errors = StoreErrorSerializer(many=True)  # type: ignore[assignment]  # (a field named errors)


class WriteInSerializer(RefusingUnknown):
    input = serializers.JSONField(help_text="A string or {text, blocks}")
    output = serializers.JSONField(help_text="A string or {text, blocks}")
    metadata = MetadataField()
    session_id = SessionIdField(required=False, default="")


class WriteOutputSerializer(serializers.Serializer):
    store = StrictCharField()
    type = StrictCharField()
    action = StrictCharField(source="result.action")
    item_id = StrictIntegerField(source="result.item_id", allow_null=True)
    reason = StrictCharField(source="result.reason")
    trimmed = StrictIntegerField(source="result.trimmed")


class ConfigQuerySerializer(serializers.Serializer):
    dry_run = StrictBooleanField(required=False, default=False)


class WritesOutputSerializer(serializers.Serializer):
    """Schema only: the stores written, and the stores that failed (written without)."""

    results = WriteOutputSerializer(many=True)
    errors = StoreErrorSerializer(many=True)  # type: ignore[assignment]  # (a field named errors)
