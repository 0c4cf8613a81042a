"""A Memory Base write that committed answers success even if the database goes away
before the response is built: a client told 503 would send the write again.

The outage is real: once the service has returned (its transaction committed), the
request's own PostgreSQL backend is terminated from another connection, so the
view's read-back fails as it does when the server dies.
"""

from __future__ import annotations

import pytest
from django.db import connection, connections

from memories.bases import services
from memories.bases.api import views
from memories.bases.models import MemoryBase, MemoryBaseJob
from tests.conftest import record

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate_own_backend() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        (pid,) = cur.fetchone()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # waits for it
            assert cur.fetchone() == (True,)
    finally:
        other.close()


def _then_outage(service):
    def run(**kwargs):
        result = service(**kwargs)
        _terminate_own_backend()
        return result

    return run


@pytest.fixture
def reconnect():
    yield
    connection.close()  # the terminated connection; the next query opens a new one


def test_create_answers_201_from_what_it_created(alice_client, flow, monkeypatch, reconnect):
    monkeypatch.setattr(views, "memory_base_create", _then_outage(views.memory_base_create))
    response = alice_client.post(
        "/api/v1/memories", {"name": "mem", "flow": str(flow.pk), "threshold": 4}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    connection.close()
    mb = MemoryBase.objects.get()
    assert body["id"] == str(mb.pk) and body["knowledge_base"] == str(mb.knowledge_base_id)
    assert (body["name"], body["threshold"], body["kb_name"]) == ("mem", 4, "Memory: mem")
    assert (body["sessions"], body["total_processed"], body["active_jobs"]) == (0, 0, 0)
    assert (body["chunks"], body["mismatch"], body["last_sync_at"]) == (0, False, None)


def test_flush_answers_202_with_the_jobs_it_queued(
    alice_client, flow, memory_base, monkeypatch, reconnect
):
    monkeypatch.setattr(services, "_dispatch", lambda job: None)
    record(flow, "s1", "m1")
    record(flow, "s2", "m2")
    flush = _then_outage(views.MemoryBaseFlushView.service)
    monkeypatch.setattr(views.MemoryBaseFlushView, "service", staticmethod(flush))
    response = alice_client.post(f"/api/v1/memories/{memory_base.pk}/flush", {}, format="json")
    assert response.status_code == 202, response.content
    jobs = response.json()["jobs"]
    connection.close()
    stored = {str(j.pk): j for j in MemoryBaseJob.objects.select_related("session")}
    assert [(j["session_id"], j["status"], j["trigger"]) for j in jobs] == [
        ("s1", "queued", "manual"),
        ("s2", "queued", "manual"),
    ]
    assert {j["id"]: j["session_id"] for j in jobs} == {
        pk: job.session.session_id for pk, job in stored.items()
    }


def test_update_answers_200_with_the_new_values(alice_client, memory_base, monkeypatch, reconnect):
    monkeypatch.setattr(views, "memory_base_update", _then_outage(views.memory_base_update))
    response = alice_client.patch(
        f"/api/v1/memories/{memory_base.pk}", {"threshold": 7}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["threshold"] == 7
    connection.close()
    assert MemoryBase.objects.get().threshold == 7
