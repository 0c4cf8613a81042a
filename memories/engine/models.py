"""The engine's background state: debounced updates waiting for their extraction,
dreams (with the snapshot that undoes them) and the per-owner switches.

Facts themselves are the facts room's (``memories.facts``); these tables point at
its scopes (``Scope``).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from memories.facts.models import Fact, Scope


class PendingUpdate(models.Model):
    """One flush: messages of a scope waiting for the scope's next extraction.

    Rows of one scope are coalesced into one LLM call once the newest is
    ``MEMORY_UPDATE_DEBOUNCE_SECONDS`` old (``due_at``). A run marks its rows done
    (``batch_id``, ``processed_at``) in the transaction that writes their facts, so a
    crash leaves them pending and the next run does them once.

    A run whose LLM answer could not be read (even asked again) marks its rows
    ``malformed``, with the reason in ``error`` and the start of the answer in
    ``answer_excerpt``; the messages stay (and are in the journal). ``note`` says what
    a done run learned ("nothing to learn" for a well-formed empty answer).
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        FAILED = "failed"
        MALFORMED = "malformed"

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    scope = models.ForeignKey(
        "memories.Scope", on_delete=models.CASCADE, related_name="pending_updates"
    )
    messages = models.JSONField(help_text='[{"role", "content", "at"?}]')
    source = models.CharField(max_length=16, default="api")  # api | chat | engine
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    due_at = models.DateTimeField()
    attempts = models.PositiveSmallIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    answer_excerpt = models.TextField(
        blank=True, default="", help_text="the first 500 characters of an unreadable answer"
    )
    note = models.CharField(max_length=255, blank=True, default="")
    batch_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    processed_at = models.DateTimeField(null=True, blank=True)
    # The W3C traceparent of the request that flushed it, when traces are on: the run
    # that extracts from it joins that trace.
    traceparent = models.CharField(max_length=55, blank=True, default="")

    class Meta:
        indexes = [
            # what the runs and the sweep read: a scope's pending rows, the due scopes
            models.Index(
                fields=["scope", "id"],
                condition=models.Q(status="pending"),
                name="pendingupdate_scope_pending",
            ),
            models.Index(
                fields=["due_at"],
                condition=models.Q(status="pending"),
                name="pendingupdate_due",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status="pending", processed_at__isnull=True)
                | (~models.Q(status="pending") & models.Q(processed_at__isnull=False)),
                name="pendingupdate_processed_when_not_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"update {self.pk} ({self.status})"


class FormationRun(models.Model):
    """One run of a scope's debounced updates (one extraction) and how it ended: what
    the formation health (``/healthz``, the admin's index) counts. Kept
    ``MEMORY_UPDATE_KEEP_DAYS`` like the flushes."""

    class Status(models.TextChoices):
        DONE = "done"
        MALFORMED = "malformed"
        FAILED = "failed"  # the provider failed (retried later, or given up)

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    scope = models.ForeignKey(
        "memories.Scope", on_delete=models.CASCADE, related_name="formation_runs"
    )
    batch_id = models.UUIDField()
    status = models.CharField(max_length=16, choices=Status.choices)
    updates = models.PositiveIntegerField(default=0)
    facts_learned = models.PositiveIntegerField(default=0, help_text="facts added or replaced")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["owner", "created_at"], name="formationrun_owner_time")]

    def __str__(self) -> str:
        return f"formation run {self.batch_id} ({self.status})"


class Dream(models.Model):
    """One Deep Dream of a scope: what it read (hash), what it changed, and the
    snapshot (facts and ``MEMORY.md`` before it) that ``dream_undo`` restores."""

    class Status(models.TextChoices):
        APPLIED = "applied"
        UNDONE = "undone"

    class Trigger(models.TextChoices):
        API = "api"
        SCHEDULE = "schedule"
        ADMIN = "admin"
        COMMAND = "command"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    scope = models.ForeignKey("memories.Scope", on_delete=models.CASCADE, related_name="dreams")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.APPLIED)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.API)
    lookback_days = models.PositiveSmallIntegerField()
    journal_days = models.JSONField(default=list, help_text="the journal days read")
    input_hash = models.CharField(max_length=64)
    # The inputs as the dream left them (its MEMORY.md, the same journal): a dream
    # asked again of them skips the LLM too.
    result_hash = models.CharField(max_length=64, blank=True, default="")
    facts_before = models.JSONField(default=list)
    memory_md_before = models.TextField(blank=True, default="")
    memory_md_after = models.TextField(blank=True, default="")
    diary = models.TextField(blank=True, default="")
    changes = models.JSONField(default=list, help_text="[{action, fact_id, ...}] as applied")
    llm_calls = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    undone_at = models.DateTimeField(null=True, blank=True)
    # MEMORY.md and the diary are written after the commit (of the dream, or of its
    # undo); false until they are, so the next run or read of the scope writes them.
    files_written = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["scope", "-created_at"], name="dream_scope_time")]

    def __str__(self) -> str:
        # As the admin names it (its list and the undo confirmation): scope, day, status.
        day = self.created_at.date().isoformat() if self.created_at else "(not saved)"
        return f"dream of {'/'.join(self.scope.path)} on {day} ({self.status})"


class EngineSettings(models.Model):
    """Per-owner switches of the engine's background work and of the chat proxy's
    memory tools (an owner without a row has the defaults)."""

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    # The daily Deep Dream of the owner's scopes; off: only explicit dreams run.
    dream_schedule = models.BooleanField(default=True)
    # The chat proxy's server-side memory tools (manage_memory, search_memory) for every
    # chat of the owner's end users that does not say ("memory_tools": false opts out).
    memory_tools = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "engine settings"
        verbose_name_plural = "engine settings"

    def __str__(self) -> str:
        return f"engine settings of {self.owner.username}"


class ScopeJournal(Scope):
    """Admin handle for a scope's journal, MEMORY.md and dreams (no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = "scope journal"


class EngineFact(Fact):
    """Admin handle for the engine's core facts (the facts room's table), listed under
    the memory engine with their scope, category, confidence, source and dates."""

    class Meta:
        proxy = True
        verbose_name = "fact"
        verbose_name_plural = "facts"
