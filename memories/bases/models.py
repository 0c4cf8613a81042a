from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.jobs import Job
from knowledge.models import KnowledgeBase
from memories.conversations.models import Flow


class MemoryBase(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memory_bases"
    )
    name = models.CharField(max_length=200)
    # RESTRICT: neither goes on its own while the memory base is there, and both go with
    # their owner (a deleted user: PROTECT refused that).
    flow = models.ForeignKey(Flow, on_delete=models.RESTRICT, related_name="memory_bases")
    threshold = models.PositiveIntegerField(default=10)
    # (unique in the database with owner_id last, memory_bases 0006: a table
    # distributed by owner accepts no other key)
    knowledge_base = models.OneToOneField(
        KnowledgeBase, on_delete=models.RESTRICT, related_name="memory_base"
    )
    kb_name = models.CharField(max_length=200)
    auto_capture = models.BooleanField(default=True)
    preprocess = models.BooleanField(default=False, help_text="Let an LLM distil each batch first.")
    preprocess_model = models.CharField(max_length=200, blank=True, default="")
    preprocess_instructions = models.TextField(blank=True, default="")
    preprocess_kill_phrase = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="If the LLM answers with this phrase, store nothing but advance the cursor.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "ingestion_memorybase"  # tables of its first home (ingestion)
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "name"], name="memorybase_unique_name_per_owner"
            ),
            models.CheckConstraint(
                condition=Q(threshold__gte=1), name="memorybase_threshold_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class MemoryBaseSession(models.Model):
    """Ingestion progress of one conversation: everything up to the cursor is stored."""

    id = models.BigAutoField(primary_key=True)
    memory_base = models.ForeignKey(MemoryBase, on_delete=models.CASCADE, related_name="sessions")
    session_id = models.CharField(max_length=255)
    cursor_message_id = models.BigIntegerField(null=True, blank=True)
    cursor_created_at = models.DateTimeField(null=True, blank=True)
    total_processed = models.PositiveIntegerField(default=0)
    last_sync_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "ingestion_memorybasesession"
        constraints = [
            # In the database this key and the jobs' below also hold owner_id, last
            # (memory_bases 0006: a table distributed by owner accepts no other key).
            models.UniqueConstraint(fields=["memory_base", "session_id"], name="mbsession_unique"),
            models.CheckConstraint(
                condition=Q(cursor_message_id__isnull=True, cursor_created_at__isnull=True)
                | Q(cursor_message_id__isnull=False, cursor_created_at__isnull=False),
                name="mbsession_cursor_pair",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.memory_base} / {self.session_id}"


class MemoryBaseJob(Job):
    """Ingestion of one session's pending outputs into the memory base's knowledge
    base, scope fixed when queued. Lifecycle: ``core.jobs``."""

    class Trigger(models.TextChoices):
        AUTO = "auto"
        MANUAL = "manual"
        REGENERATE = "regenerate"

    memory_base = models.ForeignKey(MemoryBase, on_delete=models.CASCADE, related_name="jobs")
    session = models.ForeignKey(MemoryBaseSession, on_delete=models.CASCADE, related_name="jobs")
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    # Immutable scope, fixed when queued: (start cursor, last message] of the session.
    start_cursor_message_id = models.BigIntegerField(null=True, blank=True)
    start_cursor_created_at = models.DateTimeField(null=True, blank=True)
    last_message_id = models.BigIntegerField()
    last_message_created_at = models.DateTimeField()
    messages_processed = models.PositiveIntegerField(default=0)
    chunks_written = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    task_id = models.CharField(max_length=64, blank=True, default="")
    # An automatic job of a preprocessing base whose owner's budget was spent waits,
    # queued, until then (the sweep leaves it be; a schedule runs it).
    deferred_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ingestion_ingestionjob"
        constraints = [
            # One active job per (memory base, session), enforced by the database.
            models.UniqueConstraint(
                fields=["session"],
                condition=Q(status__in=["queued", "running"]),
                name="ingestionjob_one_active_per_session",
            ),
        ]
        indexes = [models.Index(fields=["memory_base", "status"], name="job_mb_status")]

    def __str__(self) -> str:
        return f"{self.trigger} job {self.id} ({self.status})"
