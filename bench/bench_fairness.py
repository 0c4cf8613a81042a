"""Tenant fairness of the task queue (issue 28, item 4; ``core.broker``).

    .venv/bin/python bench/bench_fairness.py [--big 900] [--small 10] [--task-seconds 0.01]

A real worker (``manage.py worker``: the supervised django-q2 cluster, ``Q_WORKERS=2``) on
an instance of its own (``scripts.faults.harness.Instance``: its own embedded
PostgreSQL). A big tenant queues ``--big`` tasks, then a small tenant queues ``--small``;
each task sleeps ``--task-seconds``; each tenant queues its tasks in one transaction, so
the big tenant's are a backlog when the small tenant's arrive. The figure: seconds from
each tenant's tasks committed until its last task is done (django-q2's own record of when each task stopped), in
two runs:

- **unattributed**: the tasks carry no owner (what every task was before the lanes),
  so they wait in the shared lane and the broker hands them out oldest first;
- **per owner**: each tenant's tasks carry its owner (``core.queue.enqueue(...,
  owner_id=...)``), so the broker serves the two lanes in turn.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.faults.harness import Instance  # noqa: E402


def _queue(inst: Instance, count: int, seconds: float, prefix: str, owner: int | None) -> float:
    """Queue the tasks (one ``manage.py shell``, one transaction: the worker sees them all
    at once, a backlog); the wall-clock time they were committed."""
    group = f", group='owner:{owner}'" if owner is not None else ""
    out = inst.manage(
        "shell", "-c",
        "import time\nfrom django.db import transaction\nfrom django_q.tasks import async_task\n"
        "with transaction.atomic():\n"
        f"    for i in range({count}): async_task('time.sleep', {seconds}, task_name=f'{prefix}-{{i}}'{group})\n"
        "print('queued-at', time.time())",
    )  # fmt: skip
    return float(out.split("queued-at")[1].split()[0])


def _done_at(inst: Instance, prefix: str, count: int) -> float | None:
    """The wall-clock time the last of the ``count`` tasks finished, once all have."""
    done, last = inst.query(
        "SELECT count(*), extract(epoch FROM max(stopped)) FROM django_q_task WHERE name LIKE %s",
        [prefix + "-%"],
    )[0]
    return float(last) if done >= count else None


def _run(inst: Instance, args: argparse.Namespace, attributed: bool, tag: str) -> dict[str, float]:
    """Seconds from each tenant's first task queued to its last task done."""
    big, small = f"{tag}-big", f"{tag}-small"
    inst.query("WITH d AS (DELETE FROM django_q_task RETURNING 1) SELECT count(*) FROM d")
    queued = {big: _queue(inst, args.big, args.task_seconds, big, 1 if attributed else None)}
    queued[small] = _queue(inst, args.small, args.task_seconds, small, 2 if attributed else None)
    finished: dict[str, float] = {}
    while len(finished) < 2:
        for name, count in ((small, args.small), (big, args.big)):
            at = None if name in finished else _done_at(inst, name, count)
            if at is not None:
                finished[name] = at - queued[name]
        time.sleep(0.2)
    return {"small": finished[small], "big": finished[big]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # (at most 980: django-q2 keeps only the last 1,000 finished tasks, which are counted)
    parser.add_argument("--big", type=int, default=900)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--task-seconds", type=float, default=0.01)
    args = parser.parse_args()
    inst = Instance(env_overrides={"Q_WORKERS": "2"})
    inst.start("serve", "--no-worker", "--web-workers", "1")
    worker = None
    try:
        inst.wait_healthy(worker=False)
        worker = inst.spawn("worker")
        results = {}
        for attributed, tag in ((False, "unattributed"), (True, "per-owner")):
            results[tag] = _run(inst, args, attributed, tag)
        print(f"big tenant {args.big} tasks, small tenant {args.small}, "
              f"each {args.task_seconds} s, 2 workers")  # fmt: skip
        print("| queue | small tenant done after | big tenant done after |")
        print("|---|---|---|")
        for tag, r in results.items():
            print(f"| {tag} | {r['small']:.2f} s | {r['big']:.2f} s |")
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(60)
        inst.stop()
        inst.destroy()


if __name__ == "__main__":
    main()
