from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from pgvector.django import VectorField

from core.jobs import Job

# Dimensions that get an HNSW index (partial expression index per dimension, see
# migration 0002). A base with other dimensions still works, through exact search.
INDEXED_DIMENSIONS = (384, 768, 1024, 1536)
FTS_LANGUAGES = (
    "english",
    "simple",
    "french",
    "german",
    "spanish",
    "italian",
    "portuguese",
    "dutch",
)


class RegConfigField(models.CharField):
    """A PostgreSQL ``regconfig`` (text-search configuration), exchanged as its name."""

    def db_type(self, connection: object) -> str:
        return "regconfig"

    def cast_db_type(self, connection: object) -> str:
        return "regconfig"

    def from_db_value(self, value: object, expression: object, connection: object) -> object:
        return value if value is None else str(value)


class KnowledgeBase(models.Model):
    class SourceKind(models.TextChoices):
        DOCUMENTS = "documents", "Documents (API)"
        FILES = "files", "Files (read-only through the API)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="knowledge_bases"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    embedding_provider = models.CharField(max_length=32, editable=False)
    embedding_model = models.CharField(max_length=200, editable=False)
    embedding_dimensions = models.PositiveIntegerField(editable=False)
    is_memory_base = models.BooleanField(default=False, editable=False)
    source_kind = models.CharField(
        max_length=16, choices=SourceKind.choices, default=SourceKind.DOCUMENTS
    )
    language = models.CharField(max_length=32, default="english")
    chunk_size = models.PositiveIntegerField(default=1000)
    chunk_overlap = models.PositiveIntegerField(default=100)
    # Counters kept current in the same transaction as every chunk write.
    chunk_count = models.PositiveIntegerField(default=0, editable=False)
    word_count = models.PositiveBigIntegerField(default=0, editable=False)
    char_count = models.PositiveBigIntegerField(default=0, editable=False)
    size_bytes = models.PositiveBigIntegerField(default=0, editable=False)
    source_types = models.JSONField(default=list, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="kb_unique_name_per_owner"),
            models.CheckConstraint(
                condition=models.Q(chunk_overlap__lt=models.F("chunk_size")),
                name="kb_overlap_below_size",
            ),
            models.CheckConstraint(
                condition=models.Q(embedding_dimensions__gte=1, embedding_dimensions__lte=16000),
                name="kb_dimensions_range",
            ),
        ]
        indexes = [models.Index(fields=["owner", "is_memory_base"], name="kb_owner_memflag")]

    def __str__(self) -> str:
        return self.name

    @property
    def average_chunk_size(self) -> float:
        return round(self.char_count / self.chunk_count, 1) if self.chunk_count else 0.0

    def embedding_metadata(self) -> dict[str, object]:
        """The fields of a Langflow ``embedding_metadata.json``."""
        return {
            "embedding_provider": self.embedding_provider,
            "embedding_model": self.embedding_model,
            "embedding_dimensions": self.embedding_dimensions,
            "chunks": getattr(self, "live_chunks", self.chunk_count),
            "words": self.word_count,
            "characters": self.char_count,
            "avg_chunk_size": self.average_chunk_size,
            "size": self.size_bytes,
            "is_memory_base": self.is_memory_base,
            "source_types": self.source_types,
        }


class Chunk(models.Model):
    """One piece of text with its embedding and source metadata.

    ``search_vector`` (a stored generated ``tsvector`` over ``text`` with this row's
    ``fts_config``) exists in the table but not in the model: it is written by
    PostgreSQL and read only by the search SQL.
    """

    id = models.BigAutoField(primary_key=True)
    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="chunks"
    )
    source_key = models.CharField(max_length=600)
    document_key = models.CharField(max_length=512)
    text = models.TextField()
    embedding = VectorField()
    dimensions = models.PositiveSmallIntegerField()
    fts_config = RegConfigField(max_length=32, default="english")
    chunk_index = models.PositiveIntegerField(default=0)
    chunk_total = models.PositiveIntegerField(default=1)
    source_type = models.CharField(max_length=32, blank=True, default="")
    # The caller's id of the message a chunk comes from (``MESSAGE_ID_MAX``), else the
    # server's.
    message_id = models.CharField(max_length=200, blank=True, default="")
    session_id = models.CharField(max_length=255, blank=True, default="")
    flow_id = models.CharField(max_length=64, blank=True, default="")
    run_id = models.CharField(max_length=64, blank=True, default="")
    sender = models.CharField(max_length=255, blank=True, default="")
    file_path = models.TextField(blank=True, default="")
    content_hash = models.CharField(max_length=64, blank=True, default="")
    source_timestamp = models.DateTimeField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    word_count = models.PositiveIntegerField(default=0)
    # True while the row waits for the background indexer to add it to its HNSW
    # index (the partial HNSW indexes cover ``NOT index_pending`` rows only).
    # Searches rank pending rows exactly, so they are findable from the commit on.
    index_pending = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # In the database the key also holds owner_id, last (knowledge 0017: a
            # table distributed by owner accepts no other key); owner_id is not a field.
            models.UniqueConstraint(
                fields=["knowledge_base", "source_key"], name="chunk_unique_source_key"
            ),
        ]
        indexes = [
            # A document's chunks in order: a hit's neighbours in its document (search
            # context) are found through it; it serves lookups by document key too.
            models.Index(
                fields=["knowledge_base", "document_key", "chunk_index", "id"],
                name="chunk_kb_document_order",
            ),
            # Also orders a session's chunks: a search finds a hit's neighbours through it.
            models.Index(
                fields=["knowledge_base", "session_id", "source_timestamp", "id"],
                name="chunk_kb_session_order",
            ),
            models.Index(fields=["knowledge_base", "flow_id"], name="chunk_kb_flow"),
            models.Index(fields=["knowledge_base", "source_type"], name="chunk_kb_source_type"),
            models.Index(fields=["knowledge_base", "source_timestamp"], name="chunk_kb_timestamp"),
            models.Index(
                fields=["knowledge_base"],
                condition=models.Q(index_pending=True),
                name="chunk_kb_index_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source_key}: {self.text[:60]}"


class IngestJob(Job):
    """A batch of documents ingested in the background (a large POST .../documents).

    The validated documents are kept here until they are written; the task
    ``knowledge.tasks.run_ingest_job`` runs the same ingestion helper as the
    synchronous path, so running it twice yields the same chunks. Lifecycle:
    ``core.jobs``.
    """

    RETRY_HINT = "send the batch again in smaller parts"

    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="ingest_jobs"
    )
    # [{"text", "source_key", "metadata"}]; emptied once written.
    documents = models.JSONField(default=list, editable=False)
    document_count = models.PositiveIntegerField()
    char_count = models.PositiveBigIntegerField()
    chunks_written = models.PositiveIntegerField(default=0)
    chunks_deleted = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["knowledge_base", "status"], name="ingestjob_kb_status")]

    def __str__(self) -> str:
        return f"{self.knowledge_base_id} {self.status} ({self.document_count} documents)"
