"""Health of the service: database, pgvector, background worker."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.utils import timezone
from django_q.status import Stat


def pgvector_version() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    return row[0] if row else None


def pgvector_supports_iterative_scan(version: str | None) -> bool:
    """``hnsw.iterative_scan`` arrived in pgvector 0.8.0."""
    if not version:
        return False
    parts = [int(p) for p in version.split(".")[:2] if p.isdigit()]
    return tuple(parts) >= (0, 8)


def worker_status() -> dict[str, Any]:
    # Clusters publish a Stat into the shared (database) cache every few seconds,
    # with an expiry, so a present entry means a live worker.
    clusters = Stat.get_all()
    return {
        "status": "ok" if clusters else "down",
        "clusters": [
            {
                "cluster_id": str(stat.cluster_id),
                "status": stat.status,
                "workers": len(stat.workers),
            }
            for stat in clusters
        ],
    }


def health_report() -> tuple[bool, dict[str, Any]]:
    """Returns (healthy, report). Unhealthy means the database is unusable."""
    report: dict[str, Any] = {"time": timezone.now().isoformat()}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            report["database"] = {"status": "ok", "version": cursor.fetchone()[0]}
        version = pgvector_version()
        report["pgvector"] = {
            "status": "ok" if version else "missing",
            "version": version,
            "iterative_scan": pgvector_supports_iterative_scan(version),
        }
    except Exception as exc:  # noqa: BLE001 - a health check reports, it does not raise
        report["database"] = {"status": "error", "error": str(exc)}
        report["status"] = "error"
        return False, report
    try:
        report["worker"] = worker_status()
    except Exception as exc:  # noqa: BLE001
        report["worker"] = {"status": "unknown", "error": str(exc)}
    healthy = report["pgvector"]["status"] == "ok"
    degraded = report["worker"]["status"] != "ok"
    report["status"] = "ok" if healthy and not degraded else ("degraded" if healthy else "error")
    return healthy, report
