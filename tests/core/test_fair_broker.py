"""The broker serves owners in turn (``core.broker``, issue 28 item 4): a task queued for an
owner waits in that owner's lane, each claim takes the oldest task of the next lane with
work, so an owner with a backlog of 100 and one with 10 both progress from the first
claims; within a lane the order is first in, first out; no row is claimed twice; the
queue's sizes count every lane; tasks queued through ``core.queue`` and through a
debounced run's schedule land in their owner's lane; a run's schedule is one row however
many requests write it at once."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.scheduler import scheduler
from django_q.signing import SignedPackage

from core.broker import FairORM
from core.queue import enqueue, owner_group
from memories.engine.updates import schedule_name, schedule_run

pytestmark = pytest.mark.django_db


def _package(group: str | None, n: int) -> str:
    task = {"id": uuid.uuid4().hex, "name": f"t{n}", "func": "time.sleep", "args": (0,),
            "kwargs": {}, "started": timezone.now()}  # fmt: skip
    if group is not None:
        task["group"] = group
    return SignedPackage.dumps(task)


def _name(payload: str) -> str:
    return SignedPackage.loads(payload)["name"]


@pytest.fixture
def queued():
    broker = FairORM(list_key="memory")
    for n in range(100):
        broker.enqueue(_package(owner_group(1), n))
    for n in range(100, 110):
        broker.enqueue(_package(owner_group(2), n))
    for n in range(110, 115):
        broker.enqueue(_package(None, n))
    return broker


def test_each_claim_serves_the_next_owner_with_work(queued):
    lanes = dict(OrmQ.objects.values_list("pk", "key"))
    assert sorted(set(lanes.values())) == ["memory", "memory/1", "memory/2"]
    served = [queued.dequeue()[0] for _ in range(30)]
    order = [lanes[pk] for pk, _ in served]
    assert order[:15] == ["memory", "memory/1", "memory/2"] * 5  # in turn while all have work
    assert order[15:] == ["memory/1", "memory/2"] * 5 + ["memory/1"] * 5  # the shared lane ran dry
    names = [_name(payload) for _, payload in served]
    assert [n for n, lane in zip(names, order) if lane == "memory/2"] == [f"t{n}" for n in range(100, 110)]  # fmt: skip
    assert [n for n, lane in zip(names, order) if lane == "memory/1"] == [f"t{n}" for n in range(15)]  # fmt: skip
    assert (queued.queue_size(), queued.lock_size()) == (85, 30)


def test_no_task_is_claimed_twice_by_two_clusters(queued):
    other = FairORM(list_key="memory")
    claimed = []
    for _ in range(60):
        for broker in (queued, other):
            claimed.extend(pk for pk, _ in broker.dequeue() or [])
    assert len(claimed) == 115 and len(set(claimed)) == 115
    assert queued.dequeue() is None  # nothing left to claim (it waited Conf.POLL)
    assert OrmQ.objects.filter(lock__lte=timezone.now()).count() == 0


def test_a_claim_lost_to_another_cluster_is_not_taken(queued):
    row = queued._next_head()
    assert row is not None
    OrmQ.objects.filter(pk=row.pk).update(lock=timezone.now() + timedelta(seconds=60))
    assert queued.claim(row) is False
    assert OrmQ.objects.get(pk=row.pk).lock > timezone.now()


def test_an_unreadable_or_foreign_group_waits_in_the_shared_lane():
    broker = FairORM(list_key="memory")
    assert broker.lane_of(_package("owner:42", 0)) == "memory/42"
    assert broker.lane_of(_package("reports", 0)) == "memory"
    assert broker.lane_of(_package(None, 0)) == "memory"
    assert broker.lane_of("not a signed package") == "memory"


def test_work_queued_for_an_owner_lands_in_its_lane(alice, monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", False)  # (the test settings run tasks at once)
    enqueue("time.sleep", 0, task_name="lane-of-alice", owner_id=alice.pk)
    enqueue("time.sleep", 0, task_name="no-owner")
    assert sorted(OrmQ.objects.values_list("key", flat=True)) == ["memory", f"memory/{alice.pk}"]


@pytest.mark.django_db(
    transaction=True
)  # (django-q2's scheduler closes a connection in a transaction)
def test_a_debounced_runs_schedule_fires_into_its_owners_lane(alice, monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", False)
    schedule_run(7, timezone.now() - timedelta(seconds=1), owner_id=alice.pk)
    scheduler(broker=FairORM())
    (row,) = [
        r for r in OrmQ.objects.all() if r.task["func"] == "ingestion.tasks.engine_updates_run"
    ]
    assert row.key == f"memory/{alice.pk}"
    assert (row.task["args"], row.task["kwargs"]) == ((7,), {})
    assert not Schedule.objects.filter(name=schedule_name(7)).exists()  # fired, and gone


@pytest.mark.django_db(transaction=True)  # (real commits from two threads)
def test_two_flushes_at_once_leave_one_schedule_of_the_run(alice):
    """Two requests scheduling one scope's run at the same moment: one schedule, no
    error (before core migration 0010 both inserted one, and every later write of the
    scope failed with 'get() returned more than one Schedule')."""
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def schedule(seconds: int) -> None:
        try:
            with transaction.atomic():
                barrier.wait(10)
                schedule_run(9, timezone.now() + timedelta(seconds=seconds), owner_id=alice.pk)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=schedule, args=(s,)) for s in (5, 6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Schedule.objects.filter(name=schedule_name(9)).count() == 1
    with pytest.raises(IntegrityError), transaction.atomic():
        Schedule.objects.create(name=schedule_name(9), func="x", schedule_type=Schedule.ONCE)
