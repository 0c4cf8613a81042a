from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from pgvector.django import VectorField

CATEGORIES = ("preference", "knowledge", "context", "behavior", "goal", "correction")
SOURCE_KINDS = ("message", "journal", "api", "dream", "import")


class Scope(models.Model):
    """A memory scope inside an owner's tenant: its ``path`` is ``["user", "alice"]``,
    ``["org", "acme", "agent-alpha"]``...

    An end user of the owner's application is the scope ``["user", <id>]`` and keeps
    its id in ``external_id`` (the id the client sends; two owners' "alice" are two
    rows); other scopes have no ``external_id``. The owner's global memories are the
    facts of its owner-level scope, the empty path ``[]`` (``GLOBAL``: no client can
    name it, every path a client sends has 1-8 segments).

    The database keeps three more columns on the row, which the model does not
    declare (so Django never writes them back): ``fact_count`` (its links, migration
    0009) and ``text_facts`` / ``text_lexemes`` (the keyword leg's statistics, 0010).
    """

    GLOBAL: tuple[str, ...] = ()

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memory_scopes"
    )
    # NULL (not "") for scopes that are not end users: the (owner, external_id)
    # uniqueness holds for end users only.
    external_id = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    path = ArrayField(models.CharField(max_length=255), blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The chat request that made this end user and may yet fail (its upstream not answered
    # yet): that request takes it back if it fails while nothing refers to it; any other
    # use claims it first (``memories.facts.scopes``). NULL once claimed, and for every
    # scope not made so.
    made_by = models.UUIDField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "scope"
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "external_id"], name="scope_external_id_unique"
            ),
            models.UniqueConstraint(fields=["owner", "path"], name="scope_path_unique"),
            models.CheckConstraint(
                condition=models.Q(external_id__isnull=True)
                | models.Q(path__len=2, path__0="user"),
                name="scope_external_id_is_user_path",
            ),
        ]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        """The scope written one way everywhere it is shown: ``user/gina``,
        ``org/acme/bot``, ``(global memories)``."""
        return "/".join(self.path) or "(global memories)"

    @property
    def is_global(self) -> bool:
        return not self.path


class Fact(models.Model):
    """One fact: its text, embedding, category, confidence and source.

    Visible in every scope linked to it (``FactLink``). ``scope`` is set while exactly
    one scope links it (the usual case), so a scope's facts are read from one index
    range instead of a join over its links; a shared fact has no ``scope`` and its
    links are marked ``shared``. ``tokens``: what its injection line costs
    (``search.fact_line``), counted by the write service when it writes the fact.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by fact_owner_normalized (below): every index is paid by every add.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    content = models.TextField()
    normalized = models.TextField(help_text="Normalised text, for exact duplicate checks.")
    # Indexed by fact_scope (below).
    scope = models.ForeignKey(
        Scope, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
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
    tokens = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # Written by a bulk import: not in the HNSW indexes yet (the background indexer,
    # ``memories.facts.tasks.index_pending_facts``, moves it in); ranked exactly meanwhile.
    index_pending = models.BooleanField(default=False, db_default=False, editable=False)
    # When the user said it (the message time), which the flip-flop guard compares;
    # created_at is when the background job stored it.
    observed_at = models.DateTimeField()
    # When it is true in the world, where the conversation (or the API) says so; None:
    # not said (always, as far as the service knows).
    valid_from = models.DateTimeField(null=True, blank=True)
    valid_to = models.DateTimeField(null=True, blank=True)
    # Since when the service believes this version (its recorded interval's start; it
    # ends when a change closes it into a ``FactVersion``). None on rows written before
    # history was kept: ``created_at`` stands for it.
    recorded_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["owner", "normalized"], name="fact_owner_normalized"),
            # A scope's facts (its foreign key, Django's cascade). What ranking reads
            # is the scope's range of ``memories_fact_half`` (migration 0008: the
            # columns ranking needs and a 16-bit copy of the vector, kept by triggers).
            models.Index(fields=["scope"], name="fact_scope"),
            models.Index(
                fields=["scope"],
                condition=models.Q(index_pending=True),
                name="fact_scope_index_pending",
            ),  # fmt: skip
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(confidence__gte=0, confidence__lte=1),
                name="fact_confidence_0_1",
            ),
            models.CheckConstraint(
                condition=models.Q(category__in=CATEGORIES), name="fact_category_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(valid_from__isnull=True)
                | models.Q(valid_to__isnull=True)
                | models.Q(valid_from__lt=models.F("valid_to")),
                name="fact_valid_interval",
            ),
        ]

    def __str__(self) -> str:
        return self.content[:80]

    @property
    def recorded_from(self) -> Any:
        return self.recorded_at or self.created_at

    @property
    def recorded_to(self) -> None:
        return None  # a current fact: believed until now


class FactLink(models.Model):
    """The (scope, fact) link: what a scope holds. Primary key on the pair (in the
    database the key also holds owner_id, last: memories 0022; a table distributed by
    owner accepts no other key, and owner_id is not a field)."""

    pk = models.CompositePrimaryKey("scope_id", "fact_id")
    # Indexed by the primary key and factlink_fact (below).
    scope = models.ForeignKey(Scope, on_delete=models.CASCADE, related_name="links", db_index=False)
    fact = models.ForeignKey(Fact, on_delete=models.CASCADE, related_name="links", db_index=False)
    # True once the fact is linked to more than one scope (it then has no
    # ``Fact.scope``): a scope's shared facts are found through these links.
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["fact"], name="factlink_fact"),
            models.Index(fields=["scope"], condition=models.Q(shared=True), name="factlink_shared"),
        ]

    def __str__(self) -> str:
        return f"{self.scope_id} -> {self.fact_id}"


class FactChange(models.Model):
    """The audit trail: one row per change of a scope's facts. Never read by search."""

    class Action(models.TextChoices):
        ADD = "add"
        REPLACE = "replace"
        UPDATE = "update"
        DELETE = "delete"
        EVICT = "evict"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by factchange_scope_time (below).
    scope = models.ForeignKey(
        Scope, on_delete=models.CASCADE, related_name="changes", db_index=False
    )
    # Plain references (no constraint): the trail keeps naming a fact after it is deleted.
    old_fact = models.ForeignKey(
        Fact,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    new_fact = models.ForeignKey(
        Fact,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # Snapshots, so the trail still reads after a fact is deleted.
    old_content = models.TextField(blank=True, default="")
    new_content = models.TextField(blank=True, default="")
    action = models.CharField(max_length=16, choices=Action.choices)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["scope", "-created_at"], name="factchange_scope_time")]

    def __str__(self) -> str:
        """A plain caption: "added: User prefers tea", "replaced: A, now B"."""
        old, new = self.old_content[:60], self.new_content[:60]
        captions = {
            "add": f"added: {new}", "delete": f"deleted: {old}", "evict": f"evicted: {old}",
            "replace": f"replaced: {old}, now {new}", "update": f"edited: {old}, now {new}",
        }  # fmt: skip
        return captions.get(self.action, f"{self.action}: {old or new}")


class FactVersion(models.Model):
    """A closed version of a fact: what the service believed from ``recorded_from`` to
    ``recorded_to``, and the change that closed it (``action``, ``reason``, ``source``:
    who or what made it, e.g. ``{"kind": "dream", "ref": <dream id>}``), linked to its
    ``successor`` (the fact that took its place: the same id for an edit in place, a new
    one for a replacement, none for a deletion or an eviction).

    ``superseded``: the world changed (a replacement or a merge learned from a
    conversation): the version stays part of what is known of the past, true until
    ``valid_to`` (its successor's ``valid_from``, or when the user said it). A
    correction, an edit, a deletion or an eviction retracts it instead.

    Current facts stay in ``Fact`` (their indexes hold current facts only); these rows
    are read only by history, ``as_of`` / ``valid_at`` reads and export. The table also
    has ``search_vector`` (the content's and the scope's lexemes, as ``memories_fact``),
    which the model does not declare (migration 0016).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    fact_id = models.UUIDField(help_text="The id the fact had in this version.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    # Indexed by factversion_scope (below).
    scope = models.ForeignKey(Scope, on_delete=models.CASCADE, related_name="+", db_index=False)
    content = models.TextField()
    category = models.CharField(max_length=16, choices=[(c, c) for c in CATEGORIES])
    confidence = models.FloatField()
    source_kind = models.CharField(max_length=16)
    source_ref = models.CharField(max_length=255, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    embedding = VectorField()
    embedding_model = models.CharField(max_length=200)
    dimensions = models.PositiveSmallIntegerField()
    tokens = models.PositiveIntegerField(null=True, blank=True)
    observed_at = models.DateTimeField()
    valid_from = models.DateTimeField(null=True, blank=True)
    valid_to = models.DateTimeField(null=True, blank=True)
    recorded_from = models.DateTimeField()
    recorded_to = models.DateTimeField()
    created_at = models.DateTimeField(help_text="When the fact was first stored.")
    updated_at = models.DateTimeField()
    successor_id = models.UUIDField(null=True, blank=True)
    action = models.CharField(max_length=16)
    reason = models.TextField(blank=True, default="")
    source = models.JSONField(default=dict, blank=True)
    superseded = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["scope", "recorded_to"], name="factversion_scope"),
            models.Index(fields=["owner", "fact_id"], name="factversion_fact"),
            models.Index(fields=["owner", "successor_id"], name="factversion_successor"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(recorded_from__lte=models.F("recorded_to")),
                name="factversion_recorded_interval",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action}: {self.content[:60]}"


class GlobalMemory(Fact):
    """Admin handle for global (community/system) memories: the facts of owners'
    global scopes."""

    class Meta:
        proxy = True
        verbose_name = "global memory"
        verbose_name_plural = "global memories"
