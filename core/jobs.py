"""The one job lifecycle shared by every background job.

A job row is queued, claimed by a run (``attempts`` + 1, ``running``), and ends
``succeeded``, ``failed`` or ``cancelled``. A run cut off by the task time limit (a
``BaseException`` such as django-q's ``TimeoutException``) is recorded as failed,
"interrupted". A run abandoned by a dead worker stays ``running``: a sweep finds
it (``job_stale``), a new run takes it over, and after ``MAX_ATTEMPTS`` claims the
job is given up (failed). Runs take a session-level advisory lock on the job, so
a sweep never runs a job whose worker is still alive (PostgreSQL drops the lock
with a dead worker's connection).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import models, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.db import advisory_session_lock
from core.errors import ServiceError

logger = logging.getLogger(__name__)


class Job(models.Model):
    """Fields and states every job kind shares. Subclasses add their scope and counters."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE = (Status.QUEUED, Status.RUNNING)
    MAX_ATTEMPTS = 3
    # Appended to "interrupted" errors: what the client can do about it.
    RETRY_HINT = "queue it again"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    error = models.TextField(blank=True, default="")
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @classmethod
    def lock_key(cls, job_id: Any) -> str:
        return f"job:{cls._meta.label_lower}:{job_id}"


J = TypeVar("J", bound=Job)


def job_finish(model: type[Job], job_id: Any, status: str, error: str = "", **fields: Any) -> None:
    model._default_manager.filter(pk=job_id).update(
        status=status, error=error[:5000], finished_at=timezone.now(), **fields
    )


def job_claim(model: type[J], job_id: Any, *, related: tuple[str, ...] = ()) -> J | None:
    """Mark the job running for one more attempt; None if it is gone, finished,
    cancelled or given up. A job found ``running`` was abandoned (the caller holds
    its run lock) and is taken over: delivery is at least once, runs are idempotent."""
    with transaction.atomic():
        job = (
            model._default_manager.select_for_update()
            .select_related(*related)
            .filter(pk=job_id)
            .first()
        )
        if job is None or job.status not in model.ACTIVE:
            return None
        if getattr(job, "cancel_requested", False):
            job_finish(model, job.pk, Job.Status.CANCELLED)
            return None
        if job.attempts >= model.MAX_ATTEMPTS:
            job_finish(
                model,
                job.pk,
                Job.Status.FAILED,
                f"interrupted {job.attempts} times (worker timeout or restart); {model.RETRY_HINT}",
            )
            return None
        job.status, job.started_at = Job.Status.RUNNING, timezone.now()
        job.attempts += 1
        job.save(update_fields=["status", "started_at", "attempts"])
        return job


@contextmanager
def job_run_lock(model: type[Job], job_id: Any) -> Iterator[bool]:
    """Whether this process may run the job now (no live run holds it)."""
    with advisory_session_lock(model.lock_key(job_id)) as taken:
        yield taken


@contextmanager
def job_outcome(model: type[Job], job_id: Any) -> Iterator[None]:
    """Record how a claimed run ends when it ends by an exception.

    An error is the job's failure (its poller must learn what happened), logged with
    its traceback; a ``DoesNotExist`` with the job row gone too (deleted with its base or
    session meanwhile) is logged at INFO, without one. A time limit or shutdown
    (``BaseException``) is recorded as interrupted and re-raised.
    """
    try:
        yield
    except Exception as exc:
        if isinstance(exc, ObjectDoesNotExist) and not _job_exists(model, job_id):
            # What it worked on was deleted meanwhile, and the job with it (a base deleted,
            # a chat erased): an expected end, with nothing left to record it on.
            logger.info("%s %s ended: %s (deleted meanwhile)", _kind(model), job_id, exc)
            return
        logger.exception("%s %s failed", _kind(model), job_id)
        message = str(exc) if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"
        job_finish(model, job_id, Job.Status.FAILED, message)
    except BaseException as exc:
        job_finish(
            model,
            job_id,
            Job.Status.FAILED,
            f"interrupted: {type(exc).__name__}; {model.RETRY_HINT}",
        )
        raise


def _kind(model: type[Job]) -> str:
    return str(model._meta.verbose_name)


def _job_exists(model: type[Job], job_id: Any) -> bool:
    return model._default_manager.filter(pk=job_id).exists()


def job_stale(model: type[J], *, stale_seconds: float | None = None) -> QuerySet[J]:
    """Active jobs nobody seems to run: started (or queued) longer ago than the
    queue's retry period, after which django-q would have given the task up."""
    stale = float(settings.Q_CLUSTER["retry"]) if stale_seconds is None else stale_seconds
    cutoff = timezone.now() - timedelta(seconds=stale)
    return model._default_manager.filter(status__in=model.ACTIVE).filter(
        Q(started_at__lt=cutoff) | Q(started_at__isnull=True, created_at__lt=cutoff)
    )
