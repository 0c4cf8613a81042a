"""A django-q2 cluster that cannot stay stuck, and the figures that show whether it is.

Why: django-q2's workers share ``multiprocessing`` queues whose locks live in shared
memory. A worker killed while it holds one (an idle worker waits for a task *holding*
the queue's read lock) leaves it held for good: every other worker, and the pusher,
block forever and no task runs again, while the cluster's heartbeat goes on.

What: ``QclusterProgram`` is the supervised command (``manage.py worker --run-cluster``)
plus a watchdog. The cluster records in the database which broker rows its pusher
claimed (``core.worker_claims``: forgotten on acknowledgement, and handed back by any
host's supervisor once the cluster stops beating) and in a state directory which
workers are busy (``busy-<pid>``). When tasks wait (a ready row of our queue, or one
of our claims) and for ``WORKER_STALL_SECONDS`` no task finished and no worker was
busy, the supervisor kills the cluster's whole process group, hands our claimed rows
back to the broker at once (instead of after ``Q_RETRY``) and starts a new cluster.
Every process of the cluster dies with its parent (``PR_SET_PDEATHSIG`` set after each
fork), so a ``kill -9`` anywhere leaves no orphan polling the broker.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from core.supervisor import Program, die_with_parent

logger = logging.getLogger("core.qcluster")

STATE_DIR_ENV = "MEMORY_WORKER_STATE_DIR"
SUPERVISOR_FILE = "supervisor-{pid}"
_BUSY_GRACE = 30.0  # seconds past Q_TIMEOUT before a "busy" worker stops counting as progress
# Floors under WORKER_STALL_SECONDS: a loaded machine can take this long to start a
# cluster, or to refresh its heartbeat (django-q2 publishes it every 0.5 s for 3 s).
STARTUP_SECONDS = 60.0
HEARTBEAT_SECONDS = 15.0
# How often the cluster looks for due schedules (django-q2 itself: every 30 s).
SCHEDULES_SECONDS = 1.0


# --- inside the cluster process --------------------------------------------------------
def _state_dir() -> Path | None:
    value = os.environ.get(STATE_DIR_ENV)
    return Path(value) if value else None


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _tracked_broker() -> Any:
    from core.broker import FairORM
    from core.worker_claims import current_cluster, worker_claim, worker_claims_forget

    class TrackedORM(FairORM):
        """The fair ORM broker, recording in the database the rows this cluster claimed
        until they are acked (``core.worker_claims``)."""

        cluster = current_cluster()

        def claim(self, row: Any) -> bool:
            if self.cluster is None:
                return super().claim(row)
            return worker_claim(
                cluster=self.cluster, task_id=row.pk, lock_was=row.lock, lock=self.timeout(row)
            )

        def delete(self, task_id: Any) -> None:
            super().delete(task_id)
            if self.cluster is not None:
                worker_claims_forget(task_id=int(task_id))

    return TrackedORM()


def _on_task_start(sender: Any = None, task: dict[str, Any] | None = None, **kwargs: Any) -> None:
    state = _state_dir()
    if state is not None:
        task = task or {}
        ack_id = task.get("ack_id") or 0
        _write(state / f"busy-{os.getpid()}", f"{time.time()} {ack_id} {task.get('name', '')}")


def _on_task_end(sender: Any = None, **kwargs: Any) -> None:
    state = _state_dir()
    if state is not None:
        (state / f"busy-{os.getpid()}").unlink(missing_ok=True)


def run_cluster() -> None:
    """Run a django-q2 cluster in this process (what ``qcluster`` does), with every
    process it forks dying with its parent, and the claim/busy records above."""
    from django_q.cluster import Cluster
    from django_q.signals import post_execute_in_worker, pre_execute

    parent_of_fork = [os.getpid()]

    def before_fork() -> None:
        parent_of_fork[0] = os.getpid()

    def after_fork_in_child() -> None:
        die_with_parent(signal.SIGKILL, parent_of_fork[0])

    os.register_at_fork(before=before_fork, after_in_child=after_fork_in_child)
    pre_execute.connect(_on_task_start, dispatch_uid="core.qcluster.start")
    post_execute_in_worker.connect(_on_task_end, dispatch_uid="core.qcluster.end")
    cluster = Cluster(broker=_tracked_broker())
    cluster.start()
    # After the cluster's forks: a thread never crosses a fork (the sentinel forks its
    # workers, this process forks nothing more).
    stop = threading.Event()
    threading.Thread(target=look_at_schedules, args=(stop,), name="schedules", daemon=True).start()
    try:
        while cluster.sentinel is not None and cluster.sentinel.is_alive():
            cluster.sentinel.join(1)
    finally:
        stop.set()


def look_at_schedules(stop: threading.Event, every: float = SCHEDULES_SECONDS) -> None:
    """Fire due schedules within a second of their time.

    django-q2's sentinel looks at the schedules every 30 s, so a debounced memory update
    (a one-off schedule per scope) started up to 30 s after it was due. This thread
    asks every ``every`` seconds whether a schedule is due and, if one is, runs
    django-q2's own scheduler: it locks the due rows (``SELECT ... FOR UPDATE``) and
    queues each task (the ORM broker: a row in the same database) in the transaction
    that moves or deletes its schedule, so a schedule fires once however many clusters
    (on however many hosts) look at the same moment.
    """
    from django.db import connection
    from django_q.brokers import get_broker
    from django_q.scheduler import scheduler

    broker = get_broker()
    failing = False
    while not stop.wait(every):
        try:
            if any_schedule_due():
                scheduler(broker=broker)
            failing = False
        except Exception:  # noqa: BLE001 - the database may be restarting: look again
            if not failing:
                logger.warning("schedules could not be read; trying every second", exc_info=True)
            failing = True
            connection.close()


def any_schedule_due() -> bool:
    """The question django-q2's scheduler asks first (its ``next_run__lt=now`` and
    ``repeats != 0``), without a transaction or a lock: most seconds nothing is due."""
    from django.utils import timezone
    from django_q.models import Schedule

    return Schedule.objects.exclude(repeats=0).filter(next_run__lt=timezone.now()).exists()


# --- in the supervisor -----------------------------------------------------------------
def sweep_stale_states(base: Path) -> None:
    """Release the claims of this host's clusters whose supervisor died (its lock file
    is free) at once, without waiting for them to count as dead on every host."""
    from django.db import DatabaseError

    from core.worker_claims import cluster_name, worker_cluster_withdraw

    if not base.exists():
        return
    for state in base.glob("qcluster-*"):
        lock = state / "lock"
        try:
            with open(lock, "a+") as handle:
                # Shared: the live supervisor holds it exclusively, and /healthz's look
                # (``local_supervisors``) takes it shared too, without making us skip.
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                count = worker_cluster_withdraw(name=cluster_name(state))
                if count:
                    logger.warning("released %d task(s) claimed by a dead cluster", count)
        except BlockingIOError:
            continue  # a live supervisor owns it
        except DatabaseError:
            logger.warning("could not release a dead cluster's claims now", exc_info=True)
            continue  # the next start's sweep does, or any host's after CLUSTER_DEAD_SECONDS
        except OSError:
            pass
        shutil.rmtree(state, ignore_errors=True)
    for path in base.glob(SUPERVISOR_FILE.format(pid="*")):
        try:
            with open(path) as handle:
                if not _locked_by_another(handle):
                    path.unlink(missing_ok=True)  # its supervisor was killed
        except OSError:
            continue


@dataclass(frozen=True)
class LocalSupervisor:
    """A worker supervisor of this host, as its file in the state directory shows it."""

    pid: int
    alive: bool
    cluster_pid: int | None


def local_supervisors(base: Path) -> list[LocalSupervisor]:
    """The worker supervisors that use this data directory (this host's), from their
    ``supervisor-<pid>`` files: alive while one holds its file's lock (the kernel drops
    it with the process, so a ``kill -9`` cannot leave it held); a file whose lock is
    free was left by a supervisor killed without cleaning up, and stays until the next
    supervisor started here sweeps it. The file holds the pid of the supervisor's
    current cluster (empty while it starts one)."""
    found = []
    for path in sorted(base.glob(SUPERVISOR_FILE.format(pid="*"))) if base.exists() else []:
        try:
            pid = int(path.name.rpartition("-")[2])
            with open(path) as handle:
                alive = _locked_by_another(handle)
                text = handle.read().strip()
        except (OSError, ValueError):
            continue
        cluster_pid = int(text) if text.isdigit() else None
        found.append(LocalSupervisor(pid=pid, alive=alive, cluster_pid=cluster_pid))
    return found


def _locked_by_another(handle: Any) -> bool:
    # Shared, as the sweep takes it: two looks at once do not make either skip.
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(handle, fcntl.LOCK_UN)
    return False


class QclusterProgram(Program):
    """``manage.py worker --run-cluster`` under a stall watchdog."""

    def __init__(
        self, *, stall_seconds: float, check_every: float = 1.0, name: str = "worker"
    ) -> None:
        from django.conf import settings

        manage = str(settings.BASE_DIR / "manage.py")
        super().__init__(
            name,
            [sys.executable, manage, "worker", "--run-cluster"],
            stop_timeout=20.0,
            parent_death_signal=signal.SIGKILL,
        )
        self.stall_seconds = stall_seconds
        self.check_every = check_every
        self.base = Path(settings.WORKER_STATE_DIR)
        self.state: Path | None = None
        self._lock_handle: Any = None
        self._last_check = 0.0
        self._progress_at: datetime | None = None
        self._heartbeat_at: datetime | None = None
        self._up = False
        self._announced: int | None = None  # the locked supervisor-<pid> file's descriptor
        self.cluster: str | None = None  # the running cluster's name (core.worker_claims)
        self._beat_at = 0.0
        self._swept_at = 0.0

    def before_start(self) -> dict[str, str]:
        from django.db import DatabaseError
        from django.utils import timezone

        from core.worker_claims import CLUSTER_ENV, cluster_name, worker_cluster_beat

        self.base.mkdir(parents=True, exist_ok=True)
        sweep_stale_states(self.base)
        self.state = Path(tempfile.mkdtemp(prefix=f"qcluster-{os.getpid()}-", dir=self.base))
        self._lock_handle = open(self.state / "lock", "a+")  # noqa: SIM115 - held while it runs
        fcntl.flock(self._lock_handle, fcntl.LOCK_EX)
        self.cluster = cluster_name(self.state)
        self._beat_at = 0.0  # the first check beats (registers) it if this cannot
        try:
            worker_cluster_beat(name=self.cluster)  # registered before it can claim
            self._beat_at = time.monotonic()
        except DatabaseError:  # a claim fails until the cluster is registered
            logger.warning("%s: could not register its cluster yet", self.name)
        self._progress_at = self._heartbeat_at = timezone.now()
        self._up = False
        return {STATE_DIR_ENV: str(self.state), CLUSTER_ENV: self.cluster}

    def start(self) -> None:
        super().start()
        self._announce(str(self.proc.pid if self.proc is not None else ""))

    def _announce(self, cluster_pid: str) -> None:
        """Hold ``supervisor-<pid>`` in the state directory for as long as this
        supervisor lives, holding its current cluster's pid: how /healthz on this host
        tells a live worker from a dead one (``local_supervisors``)."""
        if self._announced is None:
            path = self.base / SUPERVISOR_FILE.format(pid=os.getpid())
            self._announced = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._announced, fcntl.LOCK_EX)
        os.ftruncate(self._announced, 0)
        os.pwrite(self._announced, cluster_pid.encode(), 0)

    def close(self) -> None:
        if self._announced is not None:
            (self.base / SUPERVISOR_FILE.format(pid=os.getpid())).unlink(missing_ok=True)
            os.close(self._announced)
            self._announced = None
        withdraw_watchdog_state()

    def after_stop(self) -> None:
        from core.worker_claims import cluster_name, worker_cluster_withdraw

        if self._announced is not None:
            self._announce("")  # no cluster until the next start
        if self.state is None:
            return
        try:
            count = worker_cluster_withdraw(name=self.cluster or cluster_name(self.state))
            if count:
                logger.warning("%s: released %d task(s) its cluster had claimed", self.name, count)
        except Exception:  # noqa: BLE001 - the database may be down: the next sweep does it
            logger.exception("%s: could not release claimed tasks now", self.name)
            return  # keep the directory (and drop the lock) for the next sweep
        finally:
            if self._lock_handle is not None:
                self._lock_handle.close()
                self._lock_handle = None
        shutil.rmtree(self.state, ignore_errors=True)
        self.state = None
        self.cluster = None

    def _busy(self) -> list[tuple[int, float, int]]:
        """(pid, started, broker row) of each worker that started a task and has not
        finished it."""
        found = []
        for path in self.state.glob("busy-*") if self.state else []:
            try:
                started, ack_id = path.read_text().split()[:2]
                found.append((int(path.name[5:]), float(started), int(ack_id)))
            except (OSError, ValueError):
                continue
        return found

    def busy_workers(self) -> int:
        from django.conf import settings

        limit = settings.Q_CLUSTER["timeout"] + _BUSY_GRACE
        return sum(
            1
            for pid, started, _ in self._busy()
            if psutil_alive(pid) and time.time() - started < limit
        )

    def release_dead_workers_tasks(self) -> int:
        """A worker killed mid-task takes its task with it (the sentinel replaces the
        worker, not the task): hand that task back now rather than after Q_RETRY."""
        dead = [(pid, ack_id) for pid, _, ack_id in self._busy() if not psutil_alive(pid)]
        if not dead or self.state is None:
            return 0
        from core.worker_claims import worker_claims_release

        count = worker_claims_release(
            cluster=self.cluster or "", only={ack_id for _, ack_id in dead}
        )
        for pid, _ in dead:
            (self.state / f"busy-{pid}").unlink(missing_ok=True)
        if count:
            logger.warning("%s: handed back %d task(s) of killed worker(s)", self.name, count)
        return count

    def check(self) -> str | None:
        now = time.monotonic()
        if now - self._last_check < self.check_every or self.state is None:
            return None
        self._last_check = now
        from django.db import DatabaseError, close_old_connections
        from django.utils import timezone

        from core.worker_claims import worker_claims

        close_old_connections()
        try:
            self.beat_and_sweep(now)
            self.release_dead_workers_tasks()
            figures = queue_figures(own_claims=worker_claims(cluster=self.cluster or ""))
            beating = self._beating()
        except DatabaseError:
            # The database is down: no cluster can progress (nor publish its heartbeat),
            # restarting one does not help.
            self._progress_at = self._heartbeat_at = timezone.now()
            return None
        wall = timezone.now()
        if not self._up:
            # The clock starts once the cluster runs: under load, starting Django and
            # forking the workers takes a while, and waiting tasks are not a stall then.
            if not beating:
                waited = (wall - (self._heartbeat_at or wall)).total_seconds()
                limit = max(self.stall_seconds, STARTUP_SECONDS)
                return f"not running after {waited:.0f}s" if waited > limit else None
            self._up = True
            self._progress_at = self._heartbeat_at = wall
        progress = [self._progress_at or wall]
        if figures["waiting_since"] is None or self.busy_workers():
            progress.append(wall)
        else:
            progress.append(figures["waiting_since"])
        if figures["last_finished_at"] is not None:
            progress.append(figures["last_finished_at"])
        self._progress_at = max(progress)
        idle_for = (wall - self._progress_at).total_seconds()
        publish_watchdog_state(self, figures, idle_for)
        if beating:
            self._heartbeat_at = wall
        silent = (wall - (self._heartbeat_at or wall)).total_seconds()
        if silent > max(self.stall_seconds, HEARTBEAT_SECONDS):
            # The sentinel's guard loop itself can block on a lock of a killed worker:
            # then nothing replaces dead workers and the heartbeat stops.
            return f"no heartbeat from the cluster for {silent:.0f}s"
        if idle_for > self.stall_seconds:
            return (
                f"{figures['waiting']} task(s) waiting for {figures['oldest_waiting_seconds']:.0f}s, "
                f"none finished and no worker busy for {idle_for:.0f}s"
            )
        return None

    def beat_and_sweep(self, now: float) -> None:
        """Every ``CLUSTER_BEAT_SECONDS`` say that our cluster lives; every
        ``CLUSTER_SWEEP_SECONDS`` hand back the claims of clusters (of any host) that
        stopped beating (``core.worker_claims``)."""
        from core.worker_claims import (
            CLUSTER_BEAT_SECONDS,
            CLUSTER_SWEEP_SECONDS,
            dead_worker_clusters_sweep,
            worker_cluster_beat,
        )

        if self.cluster is not None and now - self._beat_at >= CLUSTER_BEAT_SECONDS:
            worker_cluster_beat(name=self.cluster)
            self._beat_at = now
        if now - self._swept_at >= CLUSTER_SWEEP_SECONDS:
            self._swept_at = now
            for name, count in dead_worker_clusters_sweep().items():
                logger.warning(
                    "%s: cluster %s stopped beating; handed back %d task(s) it had claimed",
                    self.name,
                    name,
                    count,
                )

    def _beating(self) -> bool:
        """Whether the cluster's sentinel published its status in the last seconds."""
        from django_q.status import Stat

        pid = self.proc.pid if self.proc is not None else None
        return any(stat.pid == pid for stat in Stat.get_all())


def psutil_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --- figures (the supervisor and /healthz) ----------------------------------------------
def queue_figures(own_claims: dict[int, datetime] | None = None) -> dict[str, Any]:
    """What waits in the ORM broker and when a task last finished.

    A ready row waits since its ``lock`` (set to the enqueue time, or the time it was
    handed back); a claimed row since its claim (``lock - Q_RETRY``). ``own_claims``
    (the supervisor's view) counts only this cluster's claims; without it every
    claimed row counts (the web process cannot tell whose they are).
    """
    from django.conf import settings
    from django.db.models import Max
    from django.utils import timezone
    from django_q.conf import Conf
    from django_q.models import OrmQ, Task

    from core.broker import lanes

    now = timezone.now()
    retry = timedelta(seconds=settings.Q_CLUSTER["retry"])
    rows = list(OrmQ.objects.filter(lanes(Conf.CLUSTER_NAME)).values_list("pk", "lock"))
    since = []
    for pk, lock in rows:
        if lock is None or lock <= now:
            since.append(lock or now)
        elif own_claims is None or own_claims.get(pk) == lock:
            since.append(lock - retry)
    waiting_since = min(since) if since else None
    last = Task.objects.aggregate(last=Max("stopped"))["last"]
    return {
        "waiting": len(since),
        "claimed": sum(1 for _, lock in rows if lock is not None and lock > now),
        "waiting_since": waiting_since,
        "oldest_waiting_seconds": (now - waiting_since).total_seconds() if waiting_since else 0.0,
        "last_finished_at": last,
        "last_finished_seconds_ago": (now - last).total_seconds() if last else None,
    }


WATCHDOG_CACHE_PREFIX = "memory:worker-watchdog:"


def _watchdog_key() -> str:
    return f"{WATCHDOG_CACHE_PREFIX}{os.uname().nodename}:{os.getpid()}"


def publish_watchdog_state(program: QclusterProgram, figures: dict[str, Any], idle: float) -> None:
    """Share the watchdog's view (busy workers, restarts) with /healthz on every host."""
    from django.core.cache import cache
    from django.db import DatabaseError

    state = {
        "host": os.uname().nodename,
        "pid": os.getpid(),
        "cluster_pid": program.proc.pid if program.proc is not None else None,
        "busy_workers": program.busy_workers(),
        "idle_seconds": round(idle, 1),
        "restarts": program.restarts,
        "stall_seconds": program.stall_seconds,
    }
    try:
        cache.set(_watchdog_key(), state, timeout=max(10, int(program.check_every * 5)))
    except DatabaseError:
        pass


def withdraw_watchdog_state() -> None:
    """A supervisor that stops says so at once (else /healthz lists it until it expires)."""
    from django.core.cache import cache
    from django.db import DatabaseError

    try:
        cache.delete(_watchdog_key())
    except DatabaseError:
        pass
