"""Memory stores (named, typed, owned), their items, and their attachments to agent nodes."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone
from pgvector.django import VectorField

from knowledge.models import KnowledgeBase
from memories.conversations.models import Flow

STAGES = ("pre", "plan", "gen", "critique", "finished")
STORE_NAME_REGEX = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"


class MemoryStore(models.Model):
    """A named store of one registered type; ``config`` is what its config class
    validated (``${VAR}`` references kept as written, never resolved here).

    Stores that embed record the provider, model and dimension they embed with, as a
    knowledge base does; a ``file`` store reads a file-backed knowledge base of its own.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memory_stores"
    )
    name = models.CharField(max_length=100)
    type = models.CharField(max_length=64)
    config = models.JSONField(default=dict, blank=True)
    embedding_provider = models.CharField(max_length=32, blank=True, default="", editable=False)
    embedding_model = models.CharField(max_length=200, blank=True, default="", editable=False)
    embedding_dimensions = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # (unique in the database with owner_id last, memory_stores 0007)
    knowledge_base = models.OneToOneField(
        KnowledgeBase,
        null=True,
        blank=True,
        on_delete=models.RESTRICT,  # (goes with its store, or with their owner)
        related_name="+",
        editable=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="memorystore_unique_name"),
            models.CheckConstraint(
                condition=Q(name__regex=f"^{STORE_NAME_REGEX}$"), name="memorystore_name_format"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def has_own_embedding(self) -> bool:
        """The config names its embedding (else the service default at creation)."""
        return bool(self.config.get("embedding"))


class MemoryItem(models.Model):
    """One remembered turn (or log entry). ``content_summary`` is the searched text;
    ``summary_hash`` (sha256 of the normalised summary) deduplicates per store, in the
    database; stores that keep duplicates (the blackboard) leave it null."""

    id = models.BigAutoField(primary_key=True)
    store = models.ForeignKey(MemoryStore, on_delete=models.CASCADE, related_name="items")
    content_summary = models.TextField()
    # Null (not ""): NULLs are distinct in the unique constraint, so undeduplicated
    # entries never collide.
    summary_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    input_snapshot = models.JSONField(default=dict, blank=True)
    output_snapshot = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    session_id = models.CharField(max_length=255, blank=True, default="")
    # Of the store's recorded dimension (checked on write); null without an embedder.
    embedding = VectorField(null=True, blank=True)
    # The vector's dimension: the partial HNSW indexes (one per dimension) key on it.
    dimensions = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # In the database the key also holds owner_id, last (memory_stores 0007: a
            # table distributed by owner accepts no other key); owner_id is not a field.
            models.UniqueConstraint(
                fields=["store", "summary_hash"], name="memoryitem_unique_summary"
            ),
        ]
        indexes = [
            # Recency, trimming by count (ids grow per store: writes hold the store's lock)
            models.Index(fields=["store", "id"], name="memoryitem_store_id"),
            models.Index(fields=["store", "created_at"], name="memoryitem_store_created"),
        ]

    def __str__(self) -> str:
        return self.content_summary[:60]


class MemoryAttachment(models.Model):
    """A store attached to an agent node of a flow, with its read/write strategy."""

    id = models.BigAutoField(primary_key=True)
    flow = models.ForeignKey(Flow, on_delete=models.CASCADE, related_name="+")
    node_id = models.CharField(max_length=128)
    store = models.ForeignKey(MemoryStore, on_delete=models.CASCADE, related_name="attachments")
    position = models.PositiveSmallIntegerField(default=0)
    # Empty: every stage.
    retrieve_stage = ArrayField(models.CharField(max_length=16), default=list, blank=True)
    top_k = models.PositiveSmallIntegerField(default=3)
    similarity_threshold = models.FloatField(default=-1.0)
    read = models.BooleanField(default=True)
    write = models.BooleanField(default=True)

    class Meta:
        constraints = [
            # In the database the key also holds owner_id, last (memory_stores 0007).
            models.UniqueConstraint(
                fields=["flow", "node_id", "store"], name="memoryattachment_unique_store"
            ),
            models.CheckConstraint(
                condition=Q(top_k__gte=1, top_k__lte=100), name="memoryattachment_top_k"
            ),
            models.CheckConstraint(
                condition=Q(similarity_threshold__gte=-1.0, similarity_threshold__lte=1.0),
                name="memoryattachment_threshold",
            ),
            models.CheckConstraint(
                condition=Q(retrieve_stage__contained_by=list(STAGES)),
                name="memoryattachment_stages",
            ),
        ]
        indexes = [
            models.Index(fields=["flow", "node_id", "position"], name="memoryattachment_node")
        ]

    def __str__(self) -> str:
        # As the admin's attachment rows title it: the node and the store by name.
        return f"node {self.node_id} -> store {self.store.name}"
