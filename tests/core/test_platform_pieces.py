"""The one-of-each pieces in core: schedules, id validation, decay, the error family."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule

from core.errors import Conflict, NameTaken, ServiceError
from core.qcluster import any_schedule_due, look_at_schedules
from core.schedules import declared_schedules, register_schedules
from core.scoring import decay
from core.validation import validate_end_user_id, validate_node_id, validate_session_id

pytestmark = pytest.mark.django_db


def test_schedules_are_registered_once_by_name_and_follow_their_declaration():
    names = {spec.name for spec in declared_schedules()}
    assert names == {
        "index-pending-chunks",
        "index-pending-facts",
        "ingest-jobs-sweep",
        "node-memory-cleanup",
        "memory-base-jobs-sweep",
        "engine-updates-sweep",
        "engine-dreams",
    }
    Schedule.objects.filter(name="ingest-jobs-sweep").update(func="old.path", minutes=60)
    register_schedules()
    register_schedules()  # idempotent
    rows = Schedule.objects.filter(name__in=names)
    assert sorted(rows.values_list("name", flat=True)) == sorted(names)
    sweep = rows.get(name="ingest-jobs-sweep")
    assert (sweep.func, sweep.minutes, sweep.repeats) == (
        "knowledge.tasks.ingest_jobs_sweep",
        5,
        -1,
    )


@pytest.mark.django_db(transaction=True)  # the looking threads read committed rows
def test_a_due_schedule_is_queued_within_a_second_once_however_many_look(monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", False)  # queue on the broker, as a worker does
    Schedule.objects.all().delete()
    now = timezone.now()
    Schedule.objects.create(
        name="later",
        func="math.floor",
        args="1.5",
        schedule_type=Schedule.ONCE,
        next_run=now + timedelta(hours=1),
    )
    assert not any_schedule_due()
    Schedule.objects.create(
        name="due",
        func="math.floor",
        args="2.5",
        schedule_type=Schedule.ONCE,
        next_run=now - timedelta(seconds=1),
    )
    assert any_schedule_due()
    stop = threading.Event()
    lookers = [threading.Thread(target=look_at_schedules, args=(stop, 0.05)) for _ in range(3)]
    for looker in lookers:
        looker.start()
    deadline = time.monotonic() + 5
    while Schedule.objects.filter(name="due").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # every looker has looked again since the schedule fired
    stop.set()
    for looker in lookers:
        looker.join(5)
    queued = [(task.func(), task.args(), task.group()) for task in OrmQ.objects.all()]
    assert queued == [("math.floor", (2.5,), "due")]  # once, though three looked
    assert list(Schedule.objects.values_list("name", flat=True)) == ["later"]  # untouched


@pytest.mark.parametrize(
    ("validate", "good", "bad", "field", "code"),
    [
        (validate_session_id, "chat/42:a@b+c=d", "has space", "session_id", "invalid"),
        (validate_end_user_id, "alice@example.com", "-dash-first", "user", "invalid_user"),
        (validate_node_id, "llm.node_1-a", "../etc", "node_id", "invalid"),
    ],
)
def test_one_validator_per_id_kind(validate, good, bad, field, code):
    assert validate(good) == good
    with pytest.raises(ServiceError) as info:
        validate(bad)
    assert (info.value.status_code, info.value.code, list(info.value.details)) == (
        400,
        code,
        [field],
    )
    with pytest.raises(ServiceError):
        validate("x" * 300)


def test_decay_halves_every_half_life():
    now = timezone.now()
    assert decay(now, 7, now=now) == 1.0
    assert decay(now - timedelta(days=7), 7, now=now) == pytest.approx(0.5)
    assert decay(now + timedelta(days=1), 7, now=now) == 1.0  # never above 1


def test_error_family_carries_code_status_and_details():
    error = NameTaken("taken", details={"name": "x"})
    assert isinstance(error, Conflict)
    assert (error.status_code, error.code, error.details, str(error)) == (
        409,
        "name_taken",
        {"name": "x"},
        "taken",
    )
    assert ServiceError("m", code="custom").code == "custom"


def _route_names(resolver) -> list[str]:
    from django.urls import URLPattern, URLResolver

    names: list[str] = []
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace != "admin":  # the admin's own names, namespaced
                names += _route_names(entry)
        elif isinstance(entry, URLPattern) and entry.name:
            names.append(entry.name)
    return names


def test_every_route_has_a_name_of_its_own():
    from collections import Counter

    from django.urls import get_resolver, reverse

    names = Counter(_route_names(get_resolver()))
    assert [name for name, count in names.items() if count > 1] == []
    assert names["conversation-node-memory"] == names["node-memory-attachments"] == 1
    flow = "3f1c2d4e-0000-4000-8000-000000000001"
    assert reverse("conversation-node-memory", kwargs={"session_id": "s1", "node_id": "n1"}) == (
        "/api/v1/conversations/s1/nodes/n1"
    )
    assert reverse("node-memory-attachments", kwargs={"flow_id": flow, "node_id": "n1"}) == (
        f"/api/v1/flows/{flow}/nodes/n1/memory"
    )
