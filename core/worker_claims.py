"""Worker clusters and their claims, in the database, so that every host sees them.

Why: a cluster claims a broker row (``django_q_ormq``) by moving its ``lock`` to
``now + Q_RETRY``; nobody else takes the row before then. When a cluster dies, its own
supervisor hands those rows back at once; but when the whole host dies (supervisor and
cluster together, or the machine gone), nobody on that host is left to do it, and the
rows waited for ``Q_RETRY`` (6 minutes by default).

What: each supervisor registers its cluster (``WorkerCluster``: a name unique to this
host and state directory, the host, ``beat_at``) before starting it and beats it every
``CLUSTER_BEAT_SECONDS``; the cluster records each claim (``WorkerClaim``: the row and
the lock value it set) in the statement that claims, and forgets it on
acknowledgement. Every supervisor sweeps every ``CLUSTER_SWEEP_SECONDS``: a cluster
whose beat is older than ``CLUSTER_DEAD_SECONDS`` (the database's clock, so the hosts'
clocks do not matter) is dead: its rows still locked with the recorded value go back to
the queue (``lock = now``) and its records go. Safe on every host at once: the dead
clusters are locked ``FOR UPDATE SKIP LOCKED`` while one sweep hands them back, the
update compares the lock value, the deletes are idempotent. A cluster wrongly taken for
dead (a host paused for longer than the limit) registers again at its next beat; the
tasks it was running run a second time elsewhere, which every task tolerates.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta
from pathlib import Path

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, OuterRef, QuerySet
from django.db.models.functions import Now
from django.utils import timezone
from django_q.models import OrmQ

from core.models import WorkerClaim, WorkerCluster

# How often a supervisor beats its cluster's row, and sweeps the dead clusters' rows.
CLUSTER_BEAT_SECONDS = 5.0
CLUSTER_SWEEP_SECONDS = 10.0
# A cluster not beaten for this long is dead. Well above the beat interval, a loaded
# machine's slow second and a garbage-collection pause: a live cluster taken for dead
# costs a second run of the tasks it was running, never a lost one.
CLUSTER_DEAD_SECONDS = 45.0
# The environment variable that gives the cluster process its registered name.
CLUSTER_ENV = "MEMORY_WORKER_CLUSTER"


def cluster_name(state: Path) -> str:
    """The name of the cluster that runs with the state directory ``state``: unique
    across hosts (the host's name) and on the host (the directory's)."""
    return f"{socket.gethostname()}:{state.name}"[:200]


def current_cluster() -> str | None:
    """The registered name of the cluster this process belongs to (None: a cluster
    started without a supervisor, whose claims nobody records)."""
    return os.environ.get(CLUSTER_ENV) or None


# --- services -----------------------------------------------------------------------------
def worker_cluster_beat(*, name: str) -> None:
    """Say that the cluster ``name`` is alive now (the database's clock): its row moved,
    or made again if a sweep took the cluster for dead and removed it."""
    if WorkerCluster.objects.filter(name=name).update(beat_at=Now()):
        return
    try:
        WorkerCluster.objects.get_or_create(name=name, defaults={"host": socket.gethostname()})
    except IntegrityError:  # made meanwhile: it beat just now
        pass


def worker_claim(*, cluster: str, task_id: int, lock_was: datetime | None, lock: datetime) -> bool:
    """Claim the broker row ``task_id`` for ``cluster`` unless another cluster took it
    first (its lock is no longer ``lock_was``), and record the claim, in one statement:
    there is no moment when the row is claimed and the record missing. False when the
    row was taken, or when ``cluster`` is not registered (a sweep took it for dead: its
    supervisor registers it again at the next beat)."""
    with connection.cursor() as cursor:
        try:
            cursor.execute(
                "WITH claimed AS (UPDATE django_q_ormq SET lock = %(lock)s "
                "WHERE id = %(id)s AND lock IS NOT DISTINCT FROM %(was)s "
                "AND EXISTS (SELECT FROM core_workercluster WHERE name = %(cluster)s) "
                "RETURNING id) "
                "INSERT INTO core_workerclaim (cluster_id, task_id, lock) "
                "SELECT %(cluster)s, id, %(lock)s FROM claimed "
                "ON CONFLICT (cluster_id, task_id) DO UPDATE SET lock = EXCLUDED.lock "
                "RETURNING task_id",
                {"lock": lock, "id": task_id, "was": lock_was, "cluster": cluster},
            )
            return cursor.fetchone() is not None
        except IntegrityError:  # its record went meanwhile (the foreign key, at commit)
            return False


def worker_claims_forget(*, task_id: int) -> None:
    """The row ``task_id`` was acknowledged (deleted): forget every claim of it."""
    WorkerClaim.objects.filter(task_id=task_id).delete()


def worker_claims_release(*, cluster: str, only: set[int] | None = None) -> int:
    """Hand the rows ``cluster`` claimed (or only the rows ``only``: a killed worker's)
    back to the queue now, instead of after ``Q_RETRY``; returns how many.

    Only rows still locked with the value that cluster set: a row acknowledged (gone)
    or claimed again by another cluster since is left alone. The claims are forgotten.
    The tasks run again: every task is safe to run twice."""
    claims = WorkerClaim.objects.filter(cluster_id=cluster)
    if only is not None:
        claims = claims.filter(task_id__in=only)
    with transaction.atomic():
        released = _release(claims)
        claims.delete()
    return released


def worker_cluster_withdraw(*, name: str) -> int:
    """The cluster ``name`` stopped (its supervisor saw it go): hand back its claimed
    rows and remove its record; returns how many rows went back."""
    with transaction.atomic():
        released = _release(WorkerClaim.objects.filter(cluster_id=name))
        WorkerCluster.objects.filter(name=name).delete()  # and its claims
    return released


def dead_worker_clusters_sweep(*, dead_after: float = CLUSTER_DEAD_SECONDS) -> dict[str, int]:
    """Every cluster not beaten for ``dead_after`` seconds is dead: hand back the rows it
    claimed (those still locked with its value) and remove its records. Returns the rows
    handed back per dead cluster. Safe to run on every host at once, and twice."""
    with transaction.atomic():
        dead = list(
            WorkerCluster.objects.select_for_update(skip_locked=True)
            .filter(beat_at__lt=Now() - timedelta(seconds=dead_after))
            .values_list("name", flat=True)
        )
        released = {name: _release(WorkerClaim.objects.filter(cluster_id=name)) for name in dead}
        WorkerCluster.objects.filter(name__in=dead).delete()  # and their claims
    return released


def _release(claims: QuerySet[WorkerClaim]) -> int:
    mine = claims.filter(task_id=OuterRef("pk"), lock=OuterRef("lock"))
    return OrmQ.objects.filter(Exists(mine)).update(lock=timezone.now())


# --- selectors ----------------------------------------------------------------------------
def worker_claims(*, cluster: str) -> dict[int, datetime]:
    """The rows ``cluster`` claimed and the lock value of each claim."""
    rows = WorkerClaim.objects.using("default").filter(cluster_id=cluster)
    return dict(rows.values_list("task_id", "lock"))


def worker_clusters() -> list[dict[str, object]]:
    """Every registered cluster (of every host): its name, host, seconds since its beat
    (the database's clock), rows it holds claimed, and ``alive`` (beaten within
    ``CLUSTER_DEAD_SECONDS``; a dead one stays listed until the next sweep, seconds)."""
    rows = (
        WorkerCluster.objects.using("default")
        .annotate(claimed=Count("claims"), now=Now())
        .order_by("name")
        .values_list("name", "host", "beat_at", "now", "claimed")
    )
    found = []
    for name, host, beat_at, now, claimed in rows:
        ago = max(0.0, (now - beat_at).total_seconds())
        found.append({
            "name": name, "host": host, "beat_seconds_ago": round(ago, 1),
            "claimed": claimed, "alive": ago <= CLUSTER_DEAD_SECONDS,
        })  # fmt: skip
    return found
