"""Health of the service: database, pgvector, background worker, and the sections apps
add (``app_health``: memory formation per owner)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.status import Stat

from core.db_recovery import as_database_unavailable
from core.replicas import replica_aliases, replicas_health


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


def _watchdogs() -> list[dict[str, Any]]:
    from django.core.cache import cache

    from core.qcluster import WATCHDOG_CACHE_PREFIX

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT cache_key FROM django_cache WHERE cache_key LIKE %s AND expires > now()",
            [f"%{WATCHDOG_CACHE_PREFIX}%"],
        )
        keys = [row[0].split(":", 2)[-1] for row in cursor.fetchall()]
    found = cache.get_many(keys)
    return [found[key] for key in keys if key in found]


def host_worker_status(clusters: list[Stat]) -> dict[str, Any]:
    """This host's worker, as this host sees it: its supervisors (``manage.py worker``,
    or ``serve``'s) from their files in ``WORKER_STATE_DIR``, each one's cluster alive
    when its heartbeat (``clusters``) is there. ``down`` when one was killed (its file
    left behind) or runs no live cluster (starting one, or restarting a dead one);
    ``none`` when no worker runs here (a web-only host: other hosts' workers do its
    background work, which ``worker.status`` reports)."""
    from core.qcluster import local_supervisors

    beating = {stat.pid for stat in clusters if stat.host == socket.gethostname()}
    supervisors = [
        {
            "pid": s.pid,
            "alive": s.alive,
            "cluster_pid": s.cluster_pid,
            "cluster": "ok" if s.alive and s.cluster_pid in beating else "down",
        }
        for s in local_supervisors(Path(settings.WORKER_STATE_DIR))
    ]
    if not supervisors:
        status = "none"
    else:
        status = "ok" if all(s["cluster"] == "ok" for s in supervisors) else "down"
    return {"name": socket.gethostname(), "status": status, "supervisors": supervisors}


def worker_status() -> dict[str, Any]:
    """Clusters alive (their heartbeat), and whether they get work done; and this
    host's own worker (``host``).

    Clusters publish a Stat into the shared (database) cache every few seconds, with
    an expiry, so a present entry means a live cluster (of any host on this database);
    but a cluster whose workers are deadlocked keeps its heartbeat. So: tasks waiting
    in the broker while none finished for ``WORKER_STALL_SECONDS`` and no supervised
    worker is busy is ``stalled`` (the supervisor restarts such a cluster after the
    same delay). ``registered``: the clusters whose claims every host's supervisor
    hands back once they stop beating (``core.worker_claims``), alive or dead.
    """
    from core.qcluster import queue_figures
    from core.worker_claims import worker_clusters

    clusters = Stat.get_all()
    queue = queue_figures()
    watchdogs = _watchdogs()
    busy = sum(w.get("busy_workers", 0) for w in watchdogs)
    stall = settings.WORKER_STALL_SECONDS
    last = queue["last_finished_seconds_ago"]
    stalled = (
        queue["oldest_waiting_seconds"] > stall and (last is None or last > stall) and not busy
    )
    status = "down" if not clusters else ("stalled" if stalled else "ok")
    return {
        "status": status,
        "stall_seconds": stall,
        "queue": {
            "waiting": queue["waiting"],
            "claimed": queue["claimed"],
            "oldest_waiting_seconds": round(queue["oldest_waiting_seconds"], 1),
            "last_finished_at": queue["last_finished_at"].isoformat()
            if queue["last_finished_at"]
            else None,
            "last_finished_seconds_ago": round(last, 1) if last is not None else None,
        },
        "supervisors": watchdogs,
        "clusters": [
            {
                "cluster_id": str(stat.cluster_id),
                "host": stat.host,
                "pid": stat.pid,
                "status": stat.status,
                "workers": len(stat.workers),
            }
            for stat in clusters
        ],
        "registered": worker_clusters(),
        "host": host_worker_status(clusters),
    }


def app_health(owner_ids: list[int] | None) -> dict[str, Any]:
    """The sections apps add to the full report: each app's ``health_sections`` (name ->
    dotted path of a callable taking ``owner_ids``, the owners the caller may see, None
    for every owner). A section that fails reports its error instead."""
    sections: dict[str, Any] = {}
    for config in apps.get_app_configs():
        for name, path in getattr(config, "health_sections", {}).items():
            try:
                sections[name] = import_string(path)(owner_ids=owner_ids)
            except Exception as exc:  # noqa: BLE001 - a health check reports, it does not raise
                sections[name] = {"status": "unknown", "error": str(exc)}
    return sections


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
        unavailable = as_database_unavailable(exc)
        report["database"] = {
            "status": "unavailable" if unavailable else "error",
            "error": str(exc).strip(),
        }
        if unavailable:
            report["error"] = {"code": unavailable.code, "message": str(unavailable)}
        report["status"] = "error"
        return False, report
    try:
        report["worker"] = worker_status()
    except Exception as exc:  # noqa: BLE001
        report["worker"] = {"status": "unknown", "error": str(exc)}
    if replica_aliases():  # (a replica's trouble sends reads to the primary: not degraded)
        report["replicas"] = replicas_health()
    healthy = report["pgvector"]["status"] == "ok"
    degraded = report["worker"]["status"] != "ok" or _host_worker(report) == "down"
    report["status"] = "ok" if healthy and not degraded else ("degraded" if healthy else "error")
    return healthy, report


def _host_worker(report: dict[str, Any]) -> str | None:
    return report["worker"].get("host", {}).get("status")
