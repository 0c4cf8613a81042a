"""One shape and one vocabulary for a fact at every door (the personal memories API,
global memories, the engine's API; the tools and MCP answer the same fields).

A fact: ``id``, ``content``, ``category``, ``confidence``, ``source`` (``{"kind",
"ref"}``), ``metadata``, ``observed_at``, ``created_at``, ``updated_at``, its time in the
world (``valid_from``, ``valid_to``) and the interval the service believed this version
(``recorded_from``, ``recorded_to``: null while current); a search hit adds ``score``,
``similarity`` and ``keyword_score``. Reads take ``as_of`` and ``valid_at``
(``memories.facts.timeline``). Older names stay as documented
aliases: accepted on input (``text`` for ``content``, ``q`` for ``query``, ``top_k``
for ``limit``) and echoed where clients read them (``type`` on the personal doors,
``old_vector``/``new_vector`` in a fact's history, ``deleted`` when an end user is
erased, ``fact``/``memory_id`` in the decisions of an inferred add).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from core.api.fields import (
    CHAT_ROLES,
    MetadataField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)
from core.api.serializers import OPENAI_MESSAGE_KEYS, RefusingUnknown, refuse_unknown
from memories.facts.models import CATEGORIES, SOURCE_KINDS, Fact, FactChange
from memories.facts.services import MAX_FACT_CHARS
from memories.facts.timeline import at_from, instant

AS_OF_HELP = (
    "What the service believed at this time (ISO 8601; not in the future): the versions "
    "of facts current then, not now."
)
VALID_AT_HELP = (
    "What was true in the world at this time (ISO 8601, from 1900): facts whose "
    "valid_from/valid_to hold it, past versions a change in the world replaced included."
)


def take_at(attrs: dict[str, Any]) -> dict[str, Any]:
    """``as_of`` and ``valid_at`` of validated input folded into ``at`` (an ``At`` or
    None); a bad one is a 400 naming it."""
    attrs["at"] = at_from(attrs.pop("as_of", None), attrs.pop("valid_at", None))
    return attrs


class AtFieldsMixin(serializers.Serializer):
    """``as_of`` and ``valid_at`` (read in time)."""

    as_of = StrictCharField(required=False, max_length=64, help_text=AS_OF_HELP)
    valid_at = StrictCharField(required=False, max_length=64, help_text=VALID_AT_HELP)


class ValidityFieldsMixin(serializers.Serializer):
    """``valid_from`` and ``valid_to``: when a fact is true in the world (null: not said)."""

    valid_from = StrictCharField(
        required=False, allow_null=True, max_length=64,
        help_text="From when the fact is true in the world (ISO 8601, from 1900).",
    )  # fmt: skip
    valid_to = StrictCharField(
        required=False, allow_null=True, max_length=64,
        help_text="Until when the fact was true in the world (ISO 8601), after valid_from.",
    )  # fmt: skip


def take_validity(attrs: dict[str, Any]) -> dict[str, Any]:
    """``valid_from`` / ``valid_to`` parsed (each kept only when given: null clears it)."""
    validity = {}
    for name in ("valid_from", "valid_to"):
        if name in attrs:
            validity[name] = instant(attrs.pop(name), name)
    attrs["validity"] = validity
    return attrs


class AliasesMixin:
    """Input fields with an older name: ``aliases = {"text": "content"}`` folds ``text``
    into ``content`` (both given and different: a 400 naming them)."""

    aliases: dict[str, str] = {}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for alias, name in self.aliases.items():
            if alias not in attrs:
                continue
            value = attrs.pop(alias)
            if name in attrs and attrs[name] != value:
                raise serializers.ValidationError(
                    {name: f"Give {name} or {alias} (the same field), not both."}
                )
            attrs.setdefault(name, value)
        return super().validate(attrs)  # type: ignore[misc]


class SourceSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=SOURCE_KINDS)
    ref = StrictCharField(allow_blank=True)


def _source(obj: Any) -> dict[str, str]:
    return {"kind": obj.source_kind, "ref": obj.source_ref}


@extend_schema_serializer(component_name="Fact")
class FactOutputSerializer(serializers.ModelSerializer):
    """A fact, as every door answers it (a version of it, read ``as_of`` a time)."""

    # (declared fields leave the class namespace: this does not shadow Field.source)
    source = serializers.SerializerMethodField()  # type: ignore[assignment]
    valid_from = serializers.DateTimeField(allow_null=True, read_only=True)
    valid_to = serializers.DateTimeField(allow_null=True, read_only=True)
    recorded_from = serializers.DateTimeField(
        read_only=True, help_text="Since when the service believes this version."
    )
    recorded_to = serializers.DateTimeField(
        allow_null=True, read_only=True,
        help_text="Until when it believed it; null: the current version.",
    )  # fmt: skip

    class Meta:
        model = Fact
        fields = [
            "id", "content", "category", "confidence", "source", "metadata", "observed_at",
            "created_at", "updated_at", "valid_from", "valid_to", "recorded_from",
            "recorded_to",
        ]  # fmt: skip

    @extend_schema_field(SourceSerializer)
    def get_source(self, obj: Fact) -> dict[str, str]:
        return _source(obj)


@extend_schema_serializer(component_name="Memory")
class MemoryOutputSerializer(FactOutputSerializer):
    """A fact at the personal doors (``/users/{id}/memories``, ``/global-memories``),
    with ``type``, the older field clients read: ``global`` for a global memory, else
    ``memory``."""

    type = serializers.SerializerMethodField(help_text="Deprecated: memory or global.")

    class Meta(FactOutputSerializer.Meta):
        fields = [*FactOutputSerializer.Meta.fields, "type"]

    @extend_schema_field(serializers.ChoiceField(choices=["memory", "global"]))
    def get_type(self, obj: Fact) -> str:
        return "global" if self.context.get("global") else "memory"


@extend_schema_serializer(component_name="FactHit")
class HitSerializer(serializers.Serializer):
    """A search hit: the fact and how it matched (``similarity``: cosine, null when the
    search was keyword-only; ``keyword_score``: BM25, null without a query word)."""

    id = serializers.UUIDField()
    content = StrictCharField()
    category = StrictCharField()
    confidence = StrictFloatField()
    source = serializers.SerializerMethodField()  # type: ignore[assignment]  # (as above)
    metadata = serializers.JSONField()
    score = StrictFloatField()
    similarity = StrictFloatField(allow_null=True)
    keyword_score = StrictFloatField(allow_null=True)
    observed_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    valid_from = serializers.DateTimeField(allow_null=True)
    valid_to = serializers.DateTimeField(allow_null=True)
    recorded_from = serializers.DateTimeField()
    recorded_to = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(SourceSerializer)
    def get_source(self, obj: Any) -> dict[str, str]:
        return _source(obj)


@extend_schema_serializer(component_name="MemoryHit")
class MemoryHitSerializer(HitSerializer):
    """A hit at the personal search door, with ``type`` (deprecated: memory or global)."""

    type = serializers.SerializerMethodField(help_text="Deprecated: memory or global.")

    @extend_schema_field(serializers.ChoiceField(choices=["memory", "global"]))
    def get_type(self, obj: Any) -> str:
        return "global" if not obj.scope_path else "memory"


class SearchOutputSerializer(serializers.Serializer):
    """Schema only: the scope searched, how (``mode``: hybrid, or keyword when the query
    could not be embedded) and the hits, best first."""

    scope = serializers.ListField(child=StrictCharField())
    mode = StrictCharField()
    results = HitSerializer(many=True)


class MemorySearchOutputSerializer(SearchOutputSerializer):
    """Schema only: ``SearchOutputSerializer`` with the personal door's hits."""

    results = MemoryHitSerializer(many=True)  # type: ignore[assignment]


class FactFilterSerializer(serializers.Serializer):
    category = serializers.ListField(
        child=serializers.ChoiceField(choices=CATEGORIES), required=False, min_length=1
    )
    min_confidence = StrictFloatField(min_value=0, max_value=1, required=False)

    def to_internal_value(self, data: Any) -> Any:
        refuse_unknown(data, self.fields)  # ("categroy" searched every fact)
        if isinstance(data, dict) and isinstance(data.get("category"), str):
            data = {**data, "category": [data["category"]]}
        return super().to_internal_value(data)


class FactSearchSerializer(AliasesMixin, AtFieldsMixin, RefusingUnknown):
    """What a search of facts takes, at every door."""

    aliases = {"q": "query", "top_k": "limit"}

    query = StrictCharField(max_length=10_000, required=False)
    q = StrictCharField(max_length=10_000, required=False, help_text="Another name for query.")
    limit = StrictIntegerField(min_value=1, max_value=100, required=False)
    top_k = StrictIntegerField(
        min_value=1, max_value=100, required=False, help_text="Another name for limit."
    )
    offset = StrictIntegerField(min_value=0, max_value=10_000, default=0)
    filter = FactFilterSerializer(required=False)
    half_life_days = StrictFloatField(min_value=0, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if "query" not in attrs:
            raise serializers.ValidationError({"query": "This field is required."})
        attrs.setdefault("limit", 10)
        return take_at(attrs)


@extend_schema_serializer(component_name="MemorySearch")
class MemorySearchSerializer(FactSearchSerializer):
    """The personal search door: the search of every door, plus the owner's global
    memories on request and the older similarity floor."""

    include_globals = StrictBooleanField(
        required=False, default=False,
        help_text="The owner's global memories fill what the user's hits leave of limit.",
    )  # fmt: skip
    threshold = StrictFloatField(
        min_value=-1, max_value=1, required=False,
        help_text="Deprecated: hits with a lower similarity are left out of the page.",
    )  # fmt: skip


class MemorySearchQuerySerializer(MemorySearchSerializer):
    """The GET form's parameters: the POST form's but its filter (a nested object)."""

    filter = None  # type: ignore[assignment]


class FactUpdateSerializer(AliasesMixin, ValidityFieldsMixin, serializers.Serializer):
    aliases = {"text": "content"}

    content = StrictCharField(max_length=MAX_FACT_CHARS, required=False)
    text = StrictCharField(
        max_length=MAX_FACT_CHARS, required=False, help_text="Another name for content."
    )
    category = serializers.ChoiceField(choices=CATEGORIES, required=False)
    confidence = StrictFloatField(min_value=0, max_value=1, required=False)
    reason = StrictCharField(max_length=1000, required=False, default="edited")

    def to_internal_value(self, data: Any) -> Any:
        refuse_unknown(data, self.fields)  # ("confidance": 0.3 changed nothing, and said 200)
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if not {"content", "category", "confidence", "valid_from", "valid_to"} & set(attrs):
            raise serializers.ValidationError(
                {"content": "Give at least one of content, category, confidence, valid_from, "
                 "valid_to."}
            )  # fmt: skip
        return take_validity(attrs)


class InputMessageSerializer(RefusingUnknown):
    passed_over = OPENAI_MESSAGE_KEYS

    role = serializers.ChoiceField(choices=CHAT_ROLES)
    content = StrictCharField(max_length=100_000)


class MemoryAddSerializer(AliasesMixin, ValidityFieldsMixin, RefusingUnknown):
    aliases = {"text": "content"}

    content = StrictCharField(
        required=False, max_length=100_000, help_text="The text to learn from (or store)."
    )
    text = StrictCharField(
        required=False, max_length=100_000, help_text="Another name for content."
    )
    messages = InputMessageSerializer(  # type: ignore[call-arg]  # ListSerializer takes it
        many=True, required=False, allow_empty=False
    )
    infer = StrictBooleanField(default=True)
    category = serializers.ChoiceField(
        choices=CATEGORIES, default="context", help_text="infer=false: the facts' category."
    )
    confidence = StrictFloatField(
        min_value=0, max_value=1, default=1.0, help_text="infer=false: the facts' confidence."
    )
    metadata = MetadataField()

    def validate_messages(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """As many as a run or a flush takes (``RUN_MAX_MESSAGES``; a fixed 200 was said
        nowhere), the error a list of words as every field's."""
        if len(value) > settings.RUN_MAX_MESSAGES:
            raise serializers.ValidationError(f"At most {settings.RUN_MAX_MESSAGES} messages.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if bool(attrs.get("content", "").strip()) == bool(attrs.get("messages")):
            raise serializers.ValidationError(
                {"content": "Give either a non-empty content or messages."}
            )
        if not attrs["infer"]:
            texts = (
                [attrs["content"]]
                if attrs.get("content")
                else [m["content"] for m in attrs["messages"] if m["role"] == "user"]
            )
            if not texts:
                raise serializers.ValidationError({"messages": "No user message to store."})
            if any(len(text.strip()) > MAX_FACT_CHARS for text in texts):
                raise serializers.ValidationError(
                    {"content": f"A memory stored as given is at most {MAX_FACT_CHARS} characters."}
                )
            attrs["texts"] = texts
        return take_validity(attrs)


class GlobalMemoryInSerializer(AliasesMixin, serializers.Serializer):
    aliases = {"text": "content"}

    content = StrictCharField(max_length=MAX_FACT_CHARS, required=False)
    text = StrictCharField(
        max_length=MAX_FACT_CHARS, required=False, help_text="Another name for content."
    )
    category = serializers.ChoiceField(choices=CATEGORIES, default="context")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A global memory is the owner's word: no confidence, validity or scope (which
        # a fact of the engine door takes, and this door would otherwise drop unsaid).
        refuse_unknown(self.initial_data, self.fields)
        attrs = super().validate(attrs)
        if not attrs.get("content"):
            raise serializers.ValidationError({"content": "This field is required."})
        return attrs


class SkippedSerializer(serializers.Serializer):
    """Schema only: a text not stored, and why ("confidence 0.5 < 0.7")."""

    content = StrictCharField()
    reason = StrictCharField()


class MemoryAddResultSerializer(serializers.Serializer):
    """Schema only: memories stored as given, those that were already stored, the ids
    of the user's memories trimmed by ``ENGINE_MAX_FACTS`` to make room, and the texts
    stored nowhere because their confidence is below ``ENGINE_MIN_CONFIDENCE``."""

    memories = MemoryOutputSerializer(many=True)
    duplicates = MemoryOutputSerializer(many=True)
    evicted = serializers.ListField(child=serializers.UUIDField())
    below_threshold = SkippedSerializer(many=True)


class ClosedBySerializer(serializers.Serializer):
    """The change that closed a version: its action, reason, source and successor."""

    action = StrictCharField()
    reason = StrictCharField(allow_blank=True)
    source = serializers.DictField()  # type: ignore[assignment]  # (a field named source)
    successor = serializers.UUIDField(allow_null=True)
    superseded = serializers.BooleanField(
        help_text="The world changed: the version was true until its valid_to."
    )


class VersionSerializer(serializers.Serializer):
    """One version of a fact, oldest first; ``closed_by`` null: the current one."""

    id = serializers.UUIDField(help_text="The fact's id in this version.")
    content = StrictCharField()
    category = StrictCharField()
    confidence = StrictFloatField()
    source = serializers.SerializerMethodField()  # type: ignore[assignment]  # (as above)
    metadata = serializers.JSONField()
    observed_at = serializers.DateTimeField()
    valid_from = serializers.DateTimeField(allow_null=True)
    valid_to = serializers.DateTimeField(allow_null=True)
    recorded_from = serializers.DateTimeField()
    recorded_to = serializers.DateTimeField(allow_null=True)
    closed_by = serializers.SerializerMethodField()

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)
        if hasattr(instance, "fact_id"):  # a closed version
            data["id"] = str(instance.fact_id)
        return data

    @extend_schema_field(SourceSerializer)
    def get_source(self, obj: Any) -> dict[str, str]:
        return _source(obj)

    @extend_schema_field(ClosedBySerializer(allow_null=True))
    def get_closed_by(self, obj: Any) -> dict[str, Any] | None:
        if not hasattr(obj, "fact_id"):
            return None
        return {
            "action": obj.action, "reason": obj.reason, "source": obj.source,
            "successor": obj.successor_id, "superseded": obj.superseded,
        }  # fmt: skip


class HistorySerializer(serializers.ModelSerializer):
    """An audit row of a fact (``old_vector``/``new_vector``: deprecated names of
    ``old_fact``/``new_fact``)."""

    old_vector = serializers.UUIDField(
        source="old_fact_id", allow_null=True, help_text="Deprecated: old_fact."
    )
    new_vector = serializers.UUIDField(
        source="new_fact_id", allow_null=True, help_text="Deprecated: new_fact."
    )

    class Meta:
        model = FactChange
        fields = [
            "id", "action", "old_fact", "new_fact", "old_content", "new_content", "reason",
            "created_at", "old_vector", "new_vector",
        ]  # fmt: skip


class DecisionSerializer(serializers.Serializer):
    """What the engine decided for one fact."""

    content = StrictCharField()
    action = StrictCharField()
    reason = StrictCharField(allow_blank=True)
    fact_id = StrictCharField(allow_null=True)
    target_id = StrictCharField(allow_null=True)
    match = StrictCharField(allow_null=True)
    similarity = StrictFloatField(allow_null=True)
    evicted_ids = serializers.ListField(child=StrictCharField())


class InferredDecisionSerializer(serializers.Serializer):
    """A decision of an inferred add (``POST /users/{id}/memories``, ``infer: true``):
    the decision's fields, and ``fact`` / ``memory_id``, the older names of ``content``
    / ``fact_id``."""

    content = StrictCharField()
    action = StrictCharField()
    reason = StrictCharField(allow_blank=True)
    fact_id = StrictCharField(allow_null=True)
    target_id = StrictCharField(allow_null=True)
    fact = StrictCharField(help_text="Deprecated: content.")
    memory_id = StrictCharField(allow_null=True, help_text="Deprecated: fact_id.")


class ErasedSerializer(serializers.Serializer):
    """Schema only: the scope erased and how many facts it held (``deleted``: the older
    name of ``facts_removed``)."""

    scope = serializers.ListField(child=StrictCharField())
    facts_removed = StrictIntegerField()
    deleted = StrictIntegerField(help_text="Deprecated: facts_removed.")


class FactHistoryOutputSerializer(serializers.Serializer):
    """Schema only: a fact's versions, oldest first (the current one last), and the audit
    rows of its changes (``results``, the older shape)."""

    versions = VersionSerializer(many=True)
    results = HistorySerializer(many=True)
