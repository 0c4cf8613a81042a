"""The one way to queue background work: by task path, after the transaction commits.

Hand-offs are robust: once a request's write has committed, nothing that happens while
queueing (the broker insert failing, the database gone in between, a callback's update
failing with it) turns the committed request into an error - a client told "failed"
would send the write again. What a lost hand-off left behind is picked up by the sweeps
and schedules.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import transaction

from core import tenancy

logger = logging.getLogger(__name__)

# A task done for an owner has the django-q2 group ``owner:<id>``: the broker serves each
# owner's tasks in a lane of its own, in turn with the others (core.broker).
OWNER_GROUP = tenancy.OWNER_GROUP


def owner_group(owner_id: int) -> str:
    return f"{OWNER_GROUP}{int(owner_id)}"


def _call_quietly(callback: Callable[[Any], object], value: Any, what: str) -> None:
    try:
        callback(value)
    except Exception:
        logger.exception("%s failed", what)


def enqueue(
    task_path: str,
    *args: Any,
    task_name: str,
    owner_id: int | None = None,
    on_queued: Callable[[str], object] | None = None,
    on_error: Callable[[Exception], object] | None = None,
) -> None:
    """Hand ``task_path(*args)`` to django-q2 now. Never raises: a failure is logged and
    passed to ``on_error`` (e.g. to mark a job failed so its slot frees); sweeps and
    schedules pick up what a lost enqueue left behind. A callback that fails (its
    update needs the database too) is logged, not raised. ``owner_id``: whose work it
    is, so that it waits in that owner's lane (``core.broker``)."""
    from django_q.tasks import async_task

    options = {"group": owner_group(owner_id)} if owner_id is not None else {}
    try:
        task_id = async_task(task_path, *args, task_name=task_name, **options)
    except Exception as exc:
        logger.exception("could not queue %s (%s)", task_path, task_name)
        if on_error is not None:
            _call_quietly(on_error, exc, f"on_error of {task_name}")
        return
    if on_queued is not None:
        _call_quietly(on_queued, str(task_id or ""), f"on_queued of {task_name}")


def after_commit(callback: Callable[[], object]) -> None:
    """Run ``callback`` once the current transaction commits (at once outside one); an
    exception it raises is logged, never raised into the caller whose write committed."""
    transaction.on_commit(callback, robust=True)


def enqueue_on_commit(
    task_path: str,
    *args: Any,
    task_name: str,
    owner_id: int | None = None,
    on_queued: Callable[[str], object] | None = None,
    on_error: Callable[[Exception], object] | None = None,
) -> None:
    """``enqueue`` once the current transaction commits (at once outside one): a worker
    never sees a row its caller might still roll back. The task is named by its
    dotted path, so the caller imports nothing of the room that runs it."""
    after_commit(
        lambda: enqueue(
            task_path,
            *args,
            task_name=task_name,
            owner_id=owner_id,
            on_queued=on_queued,
            on_error=on_error,
        )  # fmt: skip
    )


# What a task runs as (core.tenancy), set before it and reset after it by django-q2's
# signals (connected in core.apps): a stack, since tests run tasks inline (sync) inside
# a request or another task.
_task_states = threading.local()


def task_started(sender: object, task: dict[str, Any] | None = None, **_: Any) -> None:
    stack = _task_states.__dict__.setdefault("tokens", [])
    stack.append(tenancy.enter(tenancy.for_task((task or {}).get("group"))))


def task_ended(sender: object, **_: Any) -> None:
    stack = _task_states.__dict__.get("tokens")
    if stack:
        tenancy.leave(stack.pop())
