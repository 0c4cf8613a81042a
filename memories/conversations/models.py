from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


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
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "ingestion_message"
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
