"""Thin django-q2 tasks for personal memories."""

from __future__ import annotations

from django.utils.dateparse import parse_datetime

from memories.formation import memory_formation_run


def form_memories(owner_id: int, external_id: str, message: str, message_at: str) -> int:
    decisions = memory_formation_run(
        owner_id=owner_id, external_id=external_id, message=message,
        message_at=parse_datetime(message_at),
    )  # fmt: skip
    return len(decisions)
