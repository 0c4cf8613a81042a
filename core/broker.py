"""The task queue's broker (``Q_CLUSTER["broker_class"]``): django-q2's ORM broker with a
lane per owner, served in turn, so that one tenant's backlog does not starve the others
(issue 28, item 4).

django-q2's ORM broker hands out the oldest queued row first: a tenant that queued
100,000 tasks is served before a tenant that queued one after it. Here a task queued for
an owner (``core.queue.enqueue(..., owner_id=...)``, which names the task's django-q2
``group`` ``owner:<id>``; a schedule does the same through its ``q_options``) goes to the
row key ``<cluster>/<owner>``, any other task to ``<cluster>``, and each claim takes the
oldest task of the next lane after the last one served, in key order, wrapping around:
round robin between the owners with work waiting, first in first out within each. The
walk is one index scan (``django_q_ormq (key, id)``, core migration 0009).

The rotation is per cluster process; with several clusters each turns its own, which
keeps the shares even. Claims stay optimistic, as django-q2's are: a row is claimed by
moving its ``lock`` from the value read, so two clusters never claim one row.
"""

from __future__ import annotations

import time
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from core.queue import OWNER_GROUP


def lanes(list_key: str) -> Q:
    """Every lane of the cluster ``list_key``: its own key and ``<key>/<owner>``."""
    return Q(key=list_key) | Q(key__startswith=f"{list_key}/")


class FairORM(ORM):
    """django-q2's ORM broker, its queue in lanes per owner served in turn (module doc)."""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key or Conf.CLUSTER_NAME)
        self._last_lane = ""

    def _queued(self) -> QuerySet[OrmQ]:
        return self.get_connection().filter(lanes(self.list_key))

    def lane_of(self, task: str) -> str:
        try:
            group = SignedPackage.loads(task).get("group")
        except Exception:  # noqa: BLE001 - unreadable here is unreadable to the worker too
            return self.list_key
        if isinstance(group, str) and group.startswith(OWNER_GROUP):
            return f"{self.list_key}/{group.removeprefix(OWNER_GROUP)}"[:100]
        return self.list_key

    def enqueue(self, task: str) -> int:
        row = self.get_connection().create(
            key=self.lane_of(task), payload=task, lock=timezone.now()
        )
        return int(row.pk)

    def dequeue(self) -> list[tuple[int, str]] | None:
        claimed: list[tuple[int, str]] = []
        for _ in range(Conf.BULK):
            row = self._next_head()
            if row is None:
                break
            self._last_lane = row.key
            if self.claim(row):
                claimed.append((row.pk, row.payload))
        if not claimed:
            time.sleep(Conf.POLL)
            return None
        return claimed

    def _next_head(self) -> OrmQ | None:
        """The oldest available task of the first lane after the last one served (or of
        the first lane, wrapping around)."""
        available = self._queued().filter(lock__lt=timezone.now()).order_by("key", "id")
        return (
            available.filter(key__gt=self._last_lane).first() if self._last_lane else None
        ) or available.first()

    def claim(self, row: OrmQ) -> bool:
        """Take ``row`` unless another cluster took it first."""
        return bool(
            self.get_connection().filter(id=row.id, lock=row.lock).update(lock=self.timeout(row))
        )

    def queue_size(self) -> int:
        return self._queued().filter(lock__lte=timezone.now()).count()

    def lock_size(self) -> int:
        return self._queued().filter(lock__gt=timezone.now()).count()

    def purge_queue(self) -> Any:
        return self._queued().delete()
