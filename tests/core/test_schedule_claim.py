"""A schedule fires once per period however many clusters look at it at once (issue 28,
item 3): the claim the many-hosts test relies on, shown step by step in process.

django-q2's scheduler (``django_q.scheduler.scheduler``, which ``core.qcluster`` runs
every second in every cluster) selects the due schedules ``FOR UPDATE`` and, in the
same transaction, queues each one's task and moves its ``next_run`` a period on. A
second cluster's scheduler that looks meanwhile waits for the row; when the first
commits, PostgreSQL (READ COMMITTED) evaluates the second's ``next_run < now`` again on
the moved row, and skips it. Here the first scheduler is held inside its transaction
(its broker waits before queueing) until the second is seen waiting for the row lock.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.scheduler import scheduler

from tests.core.test_self_healing import _wait


class HeldORM(ORM):
    """The ORM broker, holding its scheduler inside the transaction until ``go``."""

    def __init__(self) -> None:
        super().__init__(list_key=Conf.CLUSTER_NAME)
        self.holding = threading.Event()  # inside the transaction, the row locked
        self.go = threading.Event()

    def enqueue(self, task: str) -> int:
        self.holding.set()
        assert self.go.wait(30)
        return super().enqueue(task)


def _waiting_for_a_row_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%%django_q_schedule%%FOR UPDATE%%'"
        )
        return cursor.fetchone()[0]


def _run(broker: ORM) -> threading.Thread:
    def look() -> None:
        try:
            scheduler(broker=broker)
        finally:
            connections.close_all()

    thread = threading.Thread(target=look)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_two_clusters_looking_at_once_fire_a_due_schedule_once(monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", False)  # queue through the broker, as a cluster does
    due = timezone.now() - timedelta(seconds=1)
    schedule = Schedule.objects.create(
        name="claim-once", func="math.floor", args="1.5", schedule_type=Schedule.MINUTES,
        minutes=1, repeats=-1, next_run=due,
    )  # fmt: skip
    Schedule.objects.exclude(pk=schedule.pk).update(next_run=due + timedelta(days=1))
    first_broker = HeldORM()
    first = _run(first_broker)
    assert first_broker.holding.wait(10)
    second = _run(ORM(list_key=Conf.CLUSTER_NAME))
    assert _wait(_waiting_for_a_row_lock, 10) == 1  # the second waits for the first's row
    first_broker.go.set()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()

    queued = list(OrmQ.objects.values_list("key", flat=True))
    assert queued == [Conf.CLUSTER_NAME]  # one task: one fire
    schedule.refresh_from_db()
    assert schedule.next_run == due + timedelta(minutes=1)  # moved one period, once
    assert schedule.task  # the task of the one fire


@pytest.mark.django_db(transaction=True)
def test_a_one_off_schedule_fires_once_when_two_clusters_look(monkeypatch):
    """A one-off schedule (a debounced update's) is deleted by the fire: the second
    scheduler finds its row gone and queues nothing."""
    monkeypatch.setattr(Conf, "SYNC", False)
    due = timezone.now() - timedelta(seconds=1)
    Schedule.objects.update(next_run=due + timedelta(days=1))
    Schedule.objects.create(
        name="once", func="math.floor", args="1.5", schedule_type=Schedule.ONCE,
        repeats=-1, next_run=due,
    )  # fmt: skip
    first_broker = HeldORM()
    first = _run(first_broker)
    assert first_broker.holding.wait(10)
    second = _run(ORM(list_key=Conf.CLUSTER_NAME))
    assert _wait(_waiting_for_a_row_lock, 10) == 1
    first_broker.go.set()
    first.join(30)
    second.join(30)

    assert OrmQ.objects.count() == 1
    assert not Schedule.objects.filter(name="once").exists()
