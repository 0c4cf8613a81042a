"""Formation health: per owner, how the debounced update runs of the last 24 hours
ended and how long ago a fact was last learned. A model that never gives a readable
answer shows as ``failing`` after its first run. Read by ``/healthz`` (an API key: its
owner; a staff session: every owner) and the admin's index."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, Max, Q
from django.utils import timezone

from memories.engine.models import FormationRun

WINDOW = timedelta(hours=24)


def _status(runs: int, bad: int) -> str:
    if not runs:
        return "idle"
    return "ok" if not bad else ("failing" if bad == runs else "degraded")


def formation_health(
    *, owner_ids: list[int] | None = None, now: datetime | None = None
) -> list[dict[str, Any]]:
    """One entry per owner (``owner_ids``; None: every owner with a run kept), by
    username: ``runs_24h``, ``malformed_24h``, ``failed_24h``, ``bad_share_24h`` (the
    share of those runs that were malformed or failed; null without runs),
    ``last_fact_learned_at`` and ``seconds_since_last_fact`` (null when no kept run
    learned one) and ``status``: ``ok``, ``degraded`` (some runs bad), ``failing``
    (every run bad) or ``idle`` (no run in 24 h)."""
    now = now or timezone.now()
    runs = FormationRun.objects.all()
    if owner_ids is not None:
        runs = runs.filter(owner_id__in=owner_ids)
    counts = {
        row["owner_id"]: row
        for row in runs.filter(created_at__gte=now - WINDOW)
        .values("owner_id")
        .annotate(
            runs=Count("id"),
            malformed=Count("id", filter=Q(status="malformed")),
            failed=Count("id", filter=Q(status="failed")),
        )  # fmt: skip
    }
    learned = dict(
        runs.filter(facts_learned__gt=0)
        .values("owner_id")
        .annotate(last=Max("created_at"))
        .values_list("owner_id", "last")
    )
    owners = set(owner_ids) if owner_ids is not None else set(counts) | set(learned)
    names = dict(get_user_model().objects.filter(pk__in=owners).values_list("pk", "username"))
    out = []
    for owner_id in sorted(owners, key=lambda pk: names.get(pk, "")):
        row = counts.get(owner_id, {"runs": 0, "malformed": 0, "failed": 0})
        bad = row["malformed"] + row["failed"]
        last = learned.get(owner_id)
        out.append({
            "owner": names.get(owner_id, str(owner_id)),
            "runs_24h": row["runs"], "malformed_24h": row["malformed"], "failed_24h": row["failed"],
            "bad_share_24h": round(bad / row["runs"], 3) if row["runs"] else None,
            "last_fact_learned_at": last.isoformat() if last else None,
            "seconds_since_last_fact": round((now - last).total_seconds()) if last else None,
            "status": _status(row["runs"], bad),
        })  # fmt: skip
    return out
