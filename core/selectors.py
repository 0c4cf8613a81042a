"""Reads for accounts and API keys, always scoped by owner."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import QuerySet

from core.models import APIKey


def api_key_list(*, owner: User) -> QuerySet[APIKey]:
    return APIKey.objects.filter(owner=owner).order_by("-created_at", "-id")


def api_key_get(*, owner: User, key_id: int) -> APIKey:
    """Raises APIKey.DoesNotExist for another owner's key, like for a missing one."""
    return api_key_list(owner=owner).get(pk=key_id)


def api_key_authenticate(*, digest: str) -> APIKey | None:
    return (
        APIKey.objects.select_related("owner")
        .filter(digest=digest, revoked_at__isnull=True, owner__is_active=True)
        .first()
    )
