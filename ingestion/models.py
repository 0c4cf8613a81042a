from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from core.jobs import Job
from knowledge.models import KnowledgeBase


class Flow(models.Model):
    """An application or agent workflow that produces messages."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="flows"
    )
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="flow_unique_name_per_owner")
        ]

    def __str__(self) -> str:
        return self.name


class Message(models.Model):
    """One message of a flow run. Ordered by the keyset (created_at, id)."""

    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"
        SYSTEM = "system"
        TOOL = "tool"

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    flow = models.ForeignKey(Flow, on_delete=models.CASCADE, related_name="messages")
    session_id = models.CharField(max_length=255)
    run_id = models.CharField(max_length=64, blank=True, default="")
    is_output = models.BooleanField(default=False)
    role = models.CharField(max_length=16, choices=Role.choices)
    sender = models.CharField(max_length=100, blank=True, default="")
    sender_name = models.CharField(max_length=200, blank=True, default="")
    text = models.TextField()
    content = models.JSONField(default=list, blank=True, help_text="Structured content blocks.")
    files = models.JSONField(default=list, blank=True, help_text="File references.")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children",
        db_column="parent_message_id",
    )  # fmt: skip
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # "Pending outputs after the cursor for this session": an index-only
            # range count on (flow, session) past the (created_at, id) cursor.
            models.Index(
                fields=["flow", "session_id", "created_at", "id"],
                condition=Q(is_output=True),
                name="message_pending_outputs",
            ),
            models.Index(
                fields=["flow", "session_id", "created_at", "id"], name="message_session_keyset"
            ),
            models.Index(fields=["owner", "created_at", "id"], name="message_owner_keyset"),
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.text[:60]}"


class MemoryBase(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memory_bases"
    )
    name = models.CharField(max_length=200)
    flow = models.ForeignKey(Flow, on_delete=models.PROTECT, related_name="memory_bases")
    threshold = models.PositiveIntegerField(default=10)
    knowledge_base = models.OneToOneField(
        KnowledgeBase, on_delete=models.PROTECT, related_name="memory_base"
    )
    kb_name = models.CharField(max_length=200)
    auto_capture = models.BooleanField(default=True)
    preprocess = models.BooleanField(default=False, help_text="Let an LLM distil each batch first.")
    preprocess_model = models.CharField(max_length=200, blank=True, default="")
    preprocess_instructions = models.TextField(blank=True, default="")
    preprocess_kill_phrase = models.CharField(
        max_length=200, blank=True, default="",
        help_text="If the LLM answers with this phrase, store nothing but advance the cursor.",
    )  # fmt: skip
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
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
        constraints = [
            models.UniqueConstraint(fields=["memory_base", "session_id"], name="mbsession_unique"),
            models.CheckConstraint(
                condition=Q(cursor_message_id__isnull=True, cursor_created_at__isnull=True)
                | Q(cursor_message_id__isnull=False, cursor_created_at__isnull=False),
                name="mbsession_cursor_pair",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.memory_base} / {self.session_id}"


class IngestionJob(Job):
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

    class Meta:
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
