from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

MESSAGE_ID_MAX = 200  # a caller's message id (conversation messages, node memory turns)
UUID_NIL = "00000000-0000-0000-0000-000000000000"  # Dify's "no parent: follows the previous"


class Flow(models.Model):
    """An application or agent workflow that produces messages."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="flows"
    )
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "ingestion_flow"  # the table of its first home (ingestion)
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
    # NULL, not "", for "no caller id": the partial unique constraint skips NULLs.
    message_id = models.CharField(  # noqa: DJ001
        max_length=MESSAGE_ID_MAX,
        null=True,
        blank=True,
        help_text="The caller's id for this message, unique within its conversation.",
    )
    run_id = models.CharField(max_length=64, blank=True, default="")
    is_output = models.BooleanField(default=False)
    role = models.CharField(max_length=16, choices=Role.choices)
    sender = models.CharField(max_length=100, blank=True, default="")
    sender_name = models.CharField(max_length=200, blank=True, default="")
    text = models.TextField()
    content = models.JSONField(default=list, blank=True, help_text="Structured content blocks.")
    files = models.JSONField(default=list, blank=True, help_text="File references.")
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        db_column="parent_message_id",
    )
    starts_thread = models.BooleanField(
        default=False, help_text="Recorded with an explicit null parent: the root of a thread."
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "ingestion_message"
        constraints = [
            # The owner last: a table distributed by owner accepts no other unique key
            # (docs/scaling.md); it follows from the flow, so the same rows are refused.
            models.UniqueConstraint(
                fields=["flow", "session_id", "message_id", "owner"],
                condition=Q(message_id__isnull=False),
                name="message_unique_caller_id",
            )
        ]
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


class ConversationSummary(models.Model):
    """The running summary of one conversation (context tier): its text, the ids of the
    messages folded into it and the last one, so the next call summarises only what
    is new. ``key`` names the conversation: ``flow:<flow id>:<session id>`` for a
    stored conversation, ``scope:<scope>:<conversation id>`` for messages a client
    sends."""

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=800)
    text = models.TextField(blank=True, default="")
    summarized_ids = models.JSONField(default=list)
    last_summarized_id = models.CharField(max_length=255, blank=True, default="")
    token_count = models.PositiveIntegerField(default=0)
    # Bumped by every fold: a writer that read an older version lost a race.
    version = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "conversation summaries"
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="summary_unique_per_conversation")
        ]

    def __str__(self) -> str:
        return f"summary of {self.key}"
