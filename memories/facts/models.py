from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from pgvector.django import VectorField

CATEGORIES = ("preference", "knowledge", "context", "behavior", "goal", "correction")


class EndUser(models.Model):
    """A memory scope inside an owner's tenant: ``["user", "alice"]``, ``["org", "acme",
    "agent-alpha"]``...

    An end user of the owner's application is the scope ``["user", <id>]`` and keeps
    its id in ``external_id`` (the id the client sends; two owners' "alice" are two
    rows); other scopes have no ``external_id``. The table kept its first name.
    """

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="end_users"
    )
    # NULL (not "") for scopes that are not end users: the (owner, external_id)
    # uniqueness holds for end users only.
    external_id = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    scope = ArrayField(models.CharField(max_length=255))
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "scope"
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "external_id"], name="enduser_unique_per_owner"
            ),
            models.UniqueConstraint(fields=["owner", "scope"], name="enduser_scope_unique"),
            models.CheckConstraint(
                condition=models.Q(external_id__isnull=True)
                | models.Q(scope__len=2, scope__0="user"),
                name="enduser_external_id_is_user_scope",
            ),
        ]

    def __str__(self) -> str:
        return self.external_id or "/".join(self.scope)


class Vector(models.Model):
    """One memory (a core fact): its text, embedding, category and confidence.

    Visible in every scope linked to it (``UserVector``). ``scope`` is set while exactly
    one scope links it (the usual case), so a scope's facts are read from one index
    range instead of a join over its links; a shared fact has no ``scope`` and its
    links are marked ``shared``.
    """

    class Type(models.TextChoices):
        MEMORY = "memory"
        GLOBAL = "global"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    content = models.TextField()
    normalized = models.TextField(help_text="Normalised text, for exact duplicate checks.")
    type = models.CharField(max_length=16, choices=Type.choices, default=Type.MEMORY)
    # Indexed by vector_scope (below).
    scope = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
        db_index=False,
    )  # fmt: skip
    category = models.CharField(
        max_length=16, choices=[(c, c) for c in CATEGORIES], default="context"
    )
    confidence = models.FloatField(default=1.0)
    # Where the fact came from: "message", "journal" (ref = the day), "api", "dream"...
    source_kind = models.CharField(max_length=16, default="message")
    source_ref = models.CharField(max_length=255, blank=True, default="")
    embedding = VectorField()
    embedding_model = models.CharField(max_length=200)
    dimensions = models.PositiveSmallIntegerField()
    metadata = models.JSONField(default=dict, blank=True)
    # When the user said it (the message time), which the flip-flop guard compares;
    # created_at is when the background job stored it.
    observed_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["owner", "type"], name="vector_owner_type"),
            models.Index(fields=["owner", "normalized"], name="vector_owner_normalized"),
            # A scope's facts (its foreign key, Django's cascade). What ranking reads
            # is the scope's range of ``memories_vector_half`` (migration 0008: the
            # columns ranking needs and a 16-bit copy of the vector, kept by triggers).
            models.Index(fields=["scope"], name="vector_scope"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(confidence__gte=0, confidence__lte=1),
                name="vector_confidence_0_1",
            ),
            models.CheckConstraint(
                condition=models.Q(category__in=CATEGORIES), name="vector_category_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.content[:80]


class UserVector(models.Model):
    """The (end user, vector) link: what retrieval reads. Primary key on the pair."""

    pk = models.CompositePrimaryKey("end_user_id", "vector_id")
    end_user = models.ForeignKey(EndUser, on_delete=models.CASCADE, related_name="links")
    vector = models.ForeignKey(Vector, on_delete=models.CASCADE, related_name="links")
    # True once the vector is linked to more than one scope (it then has no
    # ``Vector.scope``): a scope's shared facts are found through these links.
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["vector"], name="uservector_vector"),
            models.Index(
                fields=["end_user"], condition=models.Q(shared=True), name="uservector_shared"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.end_user_id} -> {self.vector_id}"


class MemoryUpdate(models.Model):
    """Audit trail of memory changes. Never read by retrieval."""

    class Action(models.TextChoices):
        ADD = "add"
        REPLACE = "replace"
        UPDATE = "update"
        DELETE = "delete"
        EVICT = "evict"

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


class GlobalMemory(Vector):
    """Admin handle for global (community/system) memories."""

    class Meta:
        proxy = True
        verbose_name = "global memory"
        verbose_name_plural = "global memories"
