"""The one way to queue background work: by task path, after the transaction commits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

logger = logging.getLogger(__name__)


def enqueue(
    task_path: str,
    *args: Any,
    task_name: str,
    on_queued: Callable[[str], object] | None = None,
    on_error: Callable[[Exception], object] | None = None,
) -> None:
    """Hand ``task_path(*args)`` to django-q2 now. Never raises: a failure is logged and
    passed to ``on_error`` (e.g. to mark a job failed so its slot frees); sweeps and
    schedules pick up what a lost enqueue left behind."""
    from django_q.tasks import async_task

    try:
        task_id = async_task(task_path, *args, task_name=task_name)
    except Exception as exc:
        logger.exception("could not queue %s (%s)", task_path, task_name)
        if on_error is not None:
            on_error(exc)
        return
    if on_queued is not None:
        on_queued(str(task_id or ""))


def enqueue_on_commit(
    task_path: str,
    *args: Any,
    task_name: str,
    on_queued: Callable[[str], object] | None = None,
    on_error: Callable[[Exception], object] | None = None,
) -> None:
    """``enqueue`` once the current transaction commits (at once outside one): a worker
    never sees a row its caller might still roll back. The task is named by its
    dotted path, so the caller imports nothing of the room that runs it."""
    transaction.on_commit(
        lambda: enqueue(
            task_path, *args, task_name=task_name, on_queued=on_queued, on_error=on_error
        )
    )
