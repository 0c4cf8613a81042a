from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

from django.conf import settings
from rest_framework import serializers

from core.api.fields import (
    MetadataField,
    QueryVectorField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)
from core.api.serializers import JOB_FIELDS, JobOutputBase, RefusingUnknown, refuse_changes
from core.validation import SESSION_ID
from knowledge.models import FTS_LANGUAGES, Chunk, IngestJob, KnowledgeBase
from knowledge.search import FILTER_KEYS, MODES
from knowledge.services.errors import COLUMN_KEYS, KnowledgeError, parse_timestamp


@cache
def column_limits() -> dict[str, int | None]:
    """The most characters each source column of a chunk holds (None: no limit)."""
    return {key: Chunk._meta.get_field(key).max_length for key in COLUMN_KEYS}


class KnowledgeBaseOutputSerializer(serializers.ModelSerializer):
    embedding = serializers.SerializerMethodField()
    metadata = serializers.SerializerMethodField()

    class Meta:
        model = KnowledgeBase
        fields = [
            "id",
            "name",
            "description",
            "is_memory_base",
            "source_kind",
            "language",
            "chunk_size",
            "chunk_overlap",
            "embedding",
            "metadata",
            "created_at",
            "updated_at",
        ]

    def get_embedding(self, kb: KnowledgeBase) -> dict[str, Any]:
        return {
            "provider": kb.embedding_provider,
            "model": kb.embedding_model,
            "dimensions": kb.embedding_dimensions,
        }

    def get_metadata(self, kb: KnowledgeBase) -> dict[str, Any]:
        return kb.embedding_metadata()


class KnowledgeBaseCreateSerializer(RefusingUnknown):
    name = StrictCharField(max_length=200)
    description = StrictCharField(required=False, allow_blank=True, default="")
    language = serializers.ChoiceField(choices=FTS_LANGUAGES, default="english")
    chunk_size = StrictIntegerField(min_value=50, max_value=20000, required=False)
    chunk_overlap = StrictIntegerField(min_value=0, max_value=10000, required=False)

    def validate_name(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Name may not be blank.")
        return value.strip()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        size = attrs.get("chunk_size", 1000)
        if attrs.get("chunk_overlap", 0) >= size:
            raise serializers.ValidationError({"chunk_overlap": "Must be below chunk_size."})
        return attrs


IMMUTABLE_KB_FIELDS = ("language", "chunk_size", "chunk_overlap", "source_kind", "is_memory_base")
READ_ONLY_KB_FIELDS = ("id", "embedding", "metadata", "created_at", "updated_at")


class KnowledgeBaseUpdateSerializer(serializers.Serializer):
    """``name`` and ``description`` change; the fields that shaped the stored chunks
    (``IMMUTABLE_KB_FIELDS``) are refused with a 400 when they differ from the base's
    (so a GET body sent back unchanged is fine); other fields are refused as unknown.
    Needs ``context={"knowledge_base": kb}``."""

    name = StrictCharField(max_length=200, required=False)
    description = StrictCharField(required=False, allow_blank=True)

    def validate_name(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Name may not be blank.")
        return value.strip()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kb: KnowledgeBase = self.context["knowledge_base"]
        refuse_changes(
            self.initial_data,
            changeable=self.fields,
            fixed={key: getattr(kb, key) for key in IMMUTABLE_KB_FIELDS},
            ignored=READ_ONLY_KB_FIELDS,
            why_fixed="{key} cannot be changed after the knowledge base is created (its "
            "chunks were made with it): create a new knowledge base and ingest again.",
            unknown="Unknown field {key}: only name and description can be changed.",
        )
        return attrs


# What a search hit's metadata says of its chunk beside the document's own metadata.
HIT_KEYS = frozenset({"source_key", "document_key", "chunk_index", "chunk_total"})


class DocumentSerializer(RefusingUnknown):
    text = StrictCharField(trim_whitespace=False)
    source_key = StrictCharField(max_length=500, required=False)
    metadata = MetadataField()

    def validate_text(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Text may not be blank.")
        if len(value) > settings.INGEST_MAX_DOCUMENT_CHARS:
            raise serializers.ValidationError(
                f"Text is longer than {settings.INGEST_MAX_DOCUMENT_CHARS} characters."
            )
        return value

    def validate_metadata(self, value: dict[str, Any]) -> dict[str, Any]:
        """The keys stored in their own chunk columns: a string (or a whole number, taken
        as its digits) that fits its column; ``session_id`` a session id;
        ``timestamp``: an ISO 8601 string."""
        errors: dict[str, list[str]] = {}
        for key, limit in column_limits().items():
            given = value.get(key)
            if given is None or given == "":
                continue
            if isinstance(given, bool) or not isinstance(given, str | int):
                errors[key] = ["Must be a string."]
            elif limit is not None and len(str(given)) > limit:
                errors[key] = [f"Ensure this field has no more than {limit} characters."]
        for key in sorted(set(value) & HIT_KEYS):  # (a hit's own would hide the client's)
            errors[key] = [f"{key} is a search hit's own metadata key: name yours otherwise."]
        session = value.get("session_id")
        if (
            "session_id" not in errors
            and session not in (None, "")
            and not SESSION_ID.matches(str(session))
        ):  # (as every session id: the session routes address it, a search filters by it)
            errors["session_id"] = [SESSION_ID.message]
        stamp = value.get("timestamp")
        if stamp is not None and stamp != "":
            if not isinstance(stamp, str):
                errors["timestamp"] = ["Must be an ISO 8601 date-time string."]
            else:
                try:
                    parse_timestamp(stamp)
                except KnowledgeError as exc:
                    errors["timestamp"] = [str(exc)]
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # Without a key the text itself names the document, so re-sending it is idempotent.
        if not attrs.get("source_key"):
            attrs["source_key"] = "sha256:" + hashlib.sha256(attrs["text"].encode()).hexdigest()
        return attrs


class IngestSerializer(RefusingUnknown):
    documents = DocumentSerializer(many=True, allow_empty=False)
    # Unset: batches over INGEST_SYNC_MAX_CHARS characters are ingested in the
    # background (202 with a job); true/false forces one way.
    background = StrictBooleanField(required=False, allow_null=True, default=None)

    def validate_documents(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(value) > settings.INGEST_MAX_DOCUMENTS:
            raise serializers.ValidationError(
                f"At most {settings.INGEST_MAX_DOCUMENTS} documents per request."
            )
        sent = self.initial_data["documents"]  # (the list the items were read from)
        seen: dict[str, int] = {}
        for i, doc in enumerate(value):
            first = seen.setdefault(doc["source_key"], i)
            if first == i:
                continue
            if "source_key" in sent[i]:
                said = f"Documents {first} and {i} have the same source_key."
            else:  # a document without one is keyed by its text
                said = (f"Documents {first} and {i} have the same text and no source_key: "
                        "send it once, or give each a source_key.")  # fmt: skip
            raise serializers.ValidationError(said)
        return value


class SearchSerializer(RefusingUnknown):
    query = StrictCharField(required=False, trim_whitespace=True, max_length=10000)
    vector = QueryVectorField(required=False, min_length=1, max_length=16000)
    top_k = StrictIntegerField(min_value=1, max_value=100, default=10)
    mode = serializers.ChoiceField(choices=MODES, default="hybrid")
    similarity_threshold = StrictFloatField(
        min_value=-1.0, max_value=1.0, required=False, allow_null=True, default=None,
        help_text="A cosine similarity: every hit holds a query word or has a similarity "
        "at least this high (a chunk that would only borrow context is no hit).",
    )  # fmt: skip
    filters = serializers.DictField(required=False, default=dict)
    rrf_k = StrictIntegerField(min_value=1, max_value=1000, required=False)
    half_life_days = StrictFloatField(
        min_value=0.001, required=False, allow_null=True, default=None,
        help_text="Each chunk's own score x 0.5^(age / half-life), before context: an old "
        "chunk lends its neighbours only its decayed score.",
    )  # fmt: skip
    query_cues = StrictBooleanField(
        required=False,
        default=True,
        help_text="Hybrid search: a turn (a chunk with a session) said in a period the query "
        'names ("in June", "on May 23, 2023", "in 2023") or up to 7 days after it, '
        "or by the one speaker the query names (its sender, or the name its text opens "
        "with), has its own score s lifted to s + 0.3 x (1 - s), before context; for a "
        'question asking when, a turn telling a time ("last week", "two days ago") by 0.2; '
        "several cues combine as 1 - prod(1 - lift). Default true.",
    )
    rewrite = StrictBooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Opt-in query rewriting: the chat LLM writes other queries, searched and "
        "fused with this one (needs LLM_BASE_URL: 503 without it; an LLM failure searches "
        "as asked). Default false.",
    )

    def validate_filters(self, value: dict[str, Any]) -> dict[str, Any]:
        allowed = {*FILTER_KEYS, "since", "until"}
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise serializers.ValidationError(
                f"Unknown filter(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}."
            )
        out = dict(value)
        for key in ("since", "until"):
            if key in out:
                out[key] = serializers.DateTimeField().to_internal_value(out[key])
        limits = column_limits()
        for key in FILTER_KEYS:
            if key not in out:
                continue
            if isinstance(out[key], bool) or not isinstance(out[key], str | int):
                raise serializers.ValidationError(f"Filter {key} must be a string.")
            limit = limits.get(key)
            if limit is not None and len(str(out[key])) > limit:
                # (no chunk could match it, and the keyword leg's scoped token has a limit)
                raise serializers.ValidationError(
                    f"Filter {key} is longer than {limit} characters, the most a chunk holds."
                )
        return out

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("query") and not attrs.get("vector"):
            raise serializers.ValidationError({"query": "Give a non-empty query or a vector."})
        if attrs["mode"] == "keyword" and not attrs.get("query"):
            raise serializers.ValidationError({"query": "Keyword search needs a text query."})
        if attrs.get("rewrite") and not attrs.get("query"):
            raise serializers.ValidationError({"query": "Query rewriting needs a text query."})
        return attrs


class MultiSearchSerializer(SearchSerializer):
    knowledge_base_ids = serializers.ListField(
        child=serializers.UUIDField(), required=False, max_length=100
    )
    include_memory_bases = StrictBooleanField(default=False)


class HitSerializer(serializers.Serializer):
    id = StrictIntegerField(source="chunk_id")
    knowledge_base = StrictCharField(source="knowledge_base_id")
    text = StrictCharField()
    metadata = serializers.DictField()
    score = StrictFloatField(
        help_text="hybrid (with or without rrf_k): 0 to 1, 1 first in both legs; mode "
        "vector: the cosine similarity (-1 to 1); mode keyword: the BM25 score (0 and up); "
        "with rewrite: the queries' scores summed, up to 1 + 0.5 per rewritten query."
    )
    vector_score = StrictFloatField(allow_null=True)
    vector_rank = StrictIntegerField(allow_null=True)
    keyword_score = StrictFloatField(allow_null=True)
    keyword_rank = StrictIntegerField(allow_null=True)


class RewriteOutputSerializer(serializers.Serializer):
    queries = serializers.ListField(
        child=StrictCharField(),
        help_text="The rewritten queries searched with the original (none: it ran as asked).",
    )
    model = StrictCharField(help_text="The model that wrote them.")
    error = StrictCharField(
        allow_null=True, help_text="Why the search ran as asked: the LLM failed or was unusable."
    )


class SearchAnswerSerializer(serializers.Serializer):
    """Schema only: a search's answer."""

    results = HitSerializer(many=True)
    rewrite = RewriteOutputSerializer(
        required=False, help_text="Only when the search rewrote its query."
    )


class ChunkOutputSerializer(serializers.Serializer):
    id = StrictIntegerField()
    source_key = StrictCharField()
    document_key = StrictCharField()
    text = StrictCharField()
    chunk_index = StrictIntegerField()
    chunk_total = StrictIntegerField()
    source_type = StrictCharField()
    session_id = StrictCharField()
    metadata = serializers.DictField()
    created_at = serializers.DateTimeField()


class IngestJobOutputSerializer(JobOutputBase):
    KIND = "knowledge_ingest"
    documents = StrictIntegerField(source="document_count")
    characters = StrictIntegerField(source="char_count")

    class Meta:
        model = IngestJob
        fields = [
            *JOB_FIELDS,
            "knowledge_base",
            "documents",
            "characters",
            "chunks_written",
            "chunks_deleted",
        ]


# Schema only: a knowledge-base job's answer, flat like every job's (it used to carry a
# copy of itself under ``job``).
IngestJobAnswerSerializer = IngestJobOutputSerializer


class IngestResultSerializer(serializers.Serializer):
    """Schema only: what a batch ingested in the request did."""

    documents = StrictIntegerField()
    chunks_written = StrictIntegerField()
    chunks_deleted = StrictIntegerField()
    knowledge_base = serializers.UUIDField(help_text="Its id, as every other answer names it.")
    chunks = StrictIntegerField(help_text="The base's chunks after the batch.")


def job_answer(job: IngestJob) -> dict[str, Any]:
    """The job, flat like every job answer."""
    return dict(IngestJobOutputSerializer(job).data)
