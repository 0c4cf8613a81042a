"""Reads for accounts and API keys, always scoped by owner."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import Now

from core import tenancy
from core.models import APIKey, UsageDay


def api_key_list(*, owner: User) -> QuerySet[APIKey]:
    return APIKey.objects.filter(owner=owner).order_by("-created_at", "-id")


def api_key_get(*, owner: User, key_id: int) -> APIKey:
    """Raises APIKey.DoesNotExist for another owner's key, like for a missing one."""
    return api_key_list(owner=owner).get(pk=key_id)


def api_key_authenticate(*, digest: str) -> APIKey | None:
    # Whose key it is is what this finds out: across owners (core.tenancy).
    with tenancy.bypass("api key lookup"):
        return (
            APIKey.objects.select_related("owner")
            .filter(digest=digest, revoked_at__isnull=True, owner__is_active=True)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))
            .first()
        )


USAGE_GROUPS = ("day", "kind", "model", "subject")
USAGE_SUMS = ("calls", "tokens_in", "tokens_out", "estimated_calls")


def usage_summary(
    *, owner: User, start: date, end: date, group_by: Sequence[str]
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The owner's usage from ``start`` to ``end`` (days, UTC, both included): the totals
    and one row per value of ``group_by`` (some of ``USAGE_GROUPS``), in their order."""
    rows = UsageDay.objects.filter(owner=owner, day__gte=start, day__lte=end)
    sums = {name: Sum(name) for name in USAGE_SUMS}
    totals = {k: int(v or 0) for k, v in rows.aggregate(**sums).items()}
    grouped = rows.values(*group_by).annotate(**sums).order_by(*group_by)
    out = []
    for row in grouped:
        item: dict[str, Any] = {key: row[key] for key in group_by}
        item |= {name: int(row[name] or 0) for name in USAGE_SUMS}
        out.append(item)
    return totals, out
