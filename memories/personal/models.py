from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from pgvector.django import VectorField


class EndUser(models.Model):
    """An end user of an owner's application, named by the id the client sends.

    Ids are scoped inside the owner's tenant: two owners' "alice" are two rows.
    """

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="end_users"
    )
    external_id = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "end user"
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "external_id"], name="enduser_unique_per_owner"
            )
        ]

    def __str__(self) -> str:
        return self.external_id


class Vector(models.Model):
    """One memory: a fact and its embedding. Shared by every user linked to it."""

    class Type(models.TextChoices):
        MEMORY = "memory"
        GLOBAL = "global"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    content = models.TextField()
    normalized = models.TextField(help_text="Normalised text, for exact duplicate checks.")
    type = models.CharField(max_length=16, choices=Type.choices, default=Type.MEMORY)
    embedding = VectorField()
    embedding_model = models.CharField(max_length=200)
    dimensions = models.PositiveSmallIntegerField()
    metadata = models.JSONField(default=dict, blank=True)
    # When the user said it (the message time), which the flip-flop guard compares;
    # created_at is when the background job stored it.
    observed_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["owner", "type"], name="vector_owner_type"),
            models.Index(fields=["owner", "normalized"], name="vector_owner_normalized"),
        ]

    def __str__(self) -> str:
        return self.content[:80]


class UserVector(models.Model):
    """The (end user, vector) link: what retrieval reads. Primary key on the pair."""

    pk = models.CompositePrimaryKey("end_user_id", "vector_id")
    end_user = models.ForeignKey(EndUser, on_delete=models.CASCADE, related_name="links")
    vector = models.ForeignKey(Vector, on_delete=models.CASCADE, related_name="links")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["vector"], name="uservector_vector")]

    def __str__(self) -> str:
        return f"{self.end_user_id} -> {self.vector_id}"


class MemoryUpdate(models.Model):
    """Audit trail of memory changes. Never read by retrieval."""

    class Action(models.TextChoices):
        ADD = "add"
        REPLACE = "replace"
        UPDATE = "update"
        DELETE = "delete"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    end_user = models.ForeignKey(EndUser, on_delete=models.CASCADE, related_name="updates")
    # Plain references (no constraint): the trail keeps naming a vector after it is deleted.
    old_vector = models.ForeignKey(
        Vector,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    new_vector = models.ForeignKey(
        Vector,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # Snapshots, so the trail still reads after a vector is deleted.
    old_content = models.TextField(blank=True, default="")
    new_content = models.TextField(blank=True, default="")
    action = models.CharField(max_length=16, choices=Action.choices)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["end_user", "-created_at"], name="memoryupdate_user_time")]

    def __str__(self) -> str:
        return f"{self.action}: {self.old_content[:40]!r} -> {self.new_content[:40]!r}"


class MetricCounter(models.Model):
    """Monotonic counters shared by every process, exported at /metrics."""

    name = models.CharField(max_length=100, primary_key=True)
    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class GlobalMemory(Vector):
    """Admin handle for global (community/system) memories."""

    class Meta:
        proxy = True
        verbose_name = "global memory"
        verbose_name_plural = "global memories"
