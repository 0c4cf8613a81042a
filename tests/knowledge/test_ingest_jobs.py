"""Large ingestion batches answer 202 with a job; the job runs the same helper."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import OperationalError, connection

from core.db import _lock_id
from core.providers.errors import ProviderError
from knowledge.models import Chunk, IngestJob
from knowledge.services import jobs as services
from knowledge.services import knowledge_ingest_job_run
from knowledge.tasks import run_ingest_job
from tests.conftest import jobs_logged
from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db


def _batch(n: int, size: int = 120) -> dict:
    return {
        "documents": [
            {"text": f"document {i} " + "lorem ipsum " * (size // 12), "source_key": f"d{i}"}
            for i in range(n)
        ]
    }


def _keys(kb) -> list[str]:
    return sorted(Chunk.objects.filter(knowledge_base=kb).values_list("source_key", flat=True))


def test_a_batch_over_the_limit_answers_202_and_the_job_writes_it(
    alice, alice_client, settings, django_capture_on_commit_callbacks
):
    settings.INGEST_SYNC_MAX_CHARS = 1000
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}/documents"
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = alice_client.post(url, _batch(12), format="json")
    assert response.status_code == 202
    job = response.json()
    assert response["Location"] == f"/api/v1/knowledge-bases/{kb.pk}/jobs/{job['id']}"
    assert (job["status"], job["documents"], job["chunks_written"]) == ("queued", 12, 0)
    assert job["characters"] == sum(len(d["text"]) for d in _batch(12)["documents"])
    assert _keys(kb) == []  # nothing written before the job runs

    polled = alice_client.get(response["Location"]).json()
    assert polled["status"] == "queued"

    assert len(callbacks) == 1
    callbacks[0]()  # the queued task; tasks run inline in tests
    polled = alice_client.get(response["Location"]).json()
    assert (polled["status"], polled["chunks_written"], polled["error"]) == ("succeeded", 12, "")
    assert polled["finished_at"] is not None
    assert _keys(kb) == sorted(f"d{i}#0" for i in range(12))
    assert IngestJob.objects.get(pk=job["id"]).documents == []  # the payload is released
    kb.refresh_from_db()
    assert kb.chunk_count == 12


def test_small_batches_stay_synchronous_and_background_can_be_forced(
    alice, alice_client, settings, django_capture_on_commit_callbacks
):
    settings.INGEST_SYNC_MAX_CHARS = 100_000
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}/documents"
    response = alice_client.post(url, _batch(2), format="json")
    assert response.status_code == 201 and response.json()["chunks_written"] == 2
    assert not IngestJob.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        forced = alice_client.post(url, {**_batch(3), "background": True}, format="json")
    assert forced.status_code == 202
    job = IngestJob.objects.get()
    assert (job.status, job.chunks_written, job.chunks_deleted) == ("succeeded", 3, 0)
    assert _keys(kb) == ["d0#0", "d1#0", "d2#0"]

    settings.INGEST_SYNC_MAX_CHARS = 10
    kept = alice_client.post(url, {**_batch(1), "background": False}, format="json")
    assert kept.status_code == 201 and IngestJob.objects.count() == 1


def test_running_a_job_twice_yields_the_same_rows(alice, alice_client, settings):
    settings.INGEST_SYNC_MAX_CHARS = 0
    kb = make_kb(alice)
    job_id = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents", _batch(4), format="json"
    ).json()["id"]
    assert run_ingest_job(job_id) == "succeeded"
    rows = list(Chunk.objects.filter(knowledge_base=kb).order_by("id").values_list("id", "text"))
    assert run_ingest_job(job_id) == "succeeded"  # finished: left alone
    # A worker that died mid-run leaves "running": the retry writes the same rows.
    IngestJob.objects.filter(pk=job_id).update(status="running")
    IngestJob.objects.filter(pk=job_id).update(documents=_batch(4)["documents"])
    assert run_ingest_job(job_id) == "succeeded"
    assert (
        list(Chunk.objects.filter(knowledge_base=kb).order_by("id").values_list("id", "text"))
        == rows
    )
    kb.refresh_from_db()
    assert kb.chunk_count == 4
    assert run_ingest_job("00000000-0000-0000-0000-000000000000") == "gone"


def test_a_failing_embedder_fails_the_job_and_writes_nothing(
    alice, alice_client, settings, monkeypatch
):
    settings.INGEST_SYNC_MAX_CHARS = 0
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}/documents"
    job_id = alice_client.post(url, _batch(3), format="json").json()["id"]

    class Broken:
        def embed(self, texts):
            raise ProviderError("embedding endpoint answered 503")

    monkeypatch.setattr("knowledge.services.ingest.kb_embedder", lambda _kb: Broken())
    job = knowledge_ingest_job_run(job_id=job_id)
    assert job.status == "failed"
    assert "503" in job.error and job.finished_at is not None
    assert _keys(kb) == []
    body = alice_client.get(f"/api/v1/knowledge-bases/{kb.pk}/jobs/{job_id}").json()
    assert (body["status"], body["chunks_written"]) == ("failed", 0)


def test_jobs_are_scoped_by_owner(alice, alice_client, bob, bob_client, settings):
    settings.INGEST_SYNC_MAX_CHARS = 0
    kb = make_kb(alice)
    job_id = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents", _batch(1), format="json"
    ).json()["id"]
    bobs_kb = make_kb(bob)
    for url in (
        f"/api/v1/knowledge-bases/{kb.pk}/jobs/{job_id}",
        f"/api/v1/knowledge-bases/{bobs_kb.pk}/jobs/{job_id}",
    ):
        response = bob_client.get(url)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    # Bob cannot queue into Alice's base either, and nothing is stored.
    response = bob_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents", _batch(2), format="json"
    )
    assert response.status_code == 404
    assert IngestJob.objects.count() == 1
    # A job under the wrong base id is not found for its owner either.
    other = make_kb(alice, name="other")
    assert alice_client.get(f"/api/v1/knowledge-bases/{other.pk}/jobs/{job_id}").status_code == 404


def test_bad_batches_are_refused_before_any_job_exists(alice, alice_client, settings):
    settings.INGEST_SYNC_MAX_CHARS = 0
    kb = make_kb(alice)
    files = make_kb(alice, name="docs", source_kind="files")
    url = f"/api/v1/knowledge-bases/{kb.pk}/documents"
    bad = [
        {"documents": [{"text": "a", "source_key": "x"}, {"text": "b", "source_key": "x"}]},
        {"documents": [{"text": "ok"}], "background": "perhaps"},
        {"documents": []},
    ]
    for body in bad:
        response = alice_client.post(url, body, format="json")
        assert response.status_code == 400, body
        assert set(response.json()["error"]) == {"code", "message", "details"}
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{files.pk}/documents", _batch(1), format="json"
    )
    assert response.status_code == 409 and response.json()["error"]["code"] == "read_only"
    assert not IngestJob.objects.exists()


def test_a_base_deleted_while_its_job_runs(alice, settings, monkeypatch, caplog):
    """The job goes with its base; its run ends on the vanished base, logged at INFO
    without a traceback (an expected end, not an error)."""
    from knowledge.services import DocumentIn, knowledge_base_delete, knowledge_ingest_job_create

    kb = make_kb(alice)
    job = knowledge_ingest_job_create(
        knowledge_base=kb, documents=[DocumentIn(text="some text", source_key="k")]
    )
    original = services.knowledge_base_ingest

    def deleted_meanwhile(*, knowledge_base, documents):
        knowledge_base_delete(knowledge_base=knowledge_base)  # cascades to the job
        return original(knowledge_base=knowledge_base, documents=documents)

    monkeypatch.setattr(services, "knowledge_base_ingest", deleted_meanwhile)
    caplog.set_level("INFO", logger="core.jobs")
    assert knowledge_ingest_job_run(job_id=str(job.pk)) is None
    assert run_ingest_job(str(job.pk)) == "gone"
    assert not Chunk.objects.exists() and not IngestJob.objects.exists()
    assert jobs_logged(caplog) == [
        ("INFO", None, f"ingest job {job.pk} ended: KnowledgeBase matching query does not "
         "exist. (deleted meanwhile)"),
    ]  # fmt: skip


def _queue(kb, *docs):
    from knowledge.services import DocumentIn, knowledge_ingest_job_create

    return knowledge_ingest_job_create(
        knowledge_base=kb, documents=[DocumentIn(text=t, source_key=k) for k, t in docs]
    )


def test_jobs_of_a_base_run_oldest_first_whichever_task_comes_first(alice):
    kb = make_kb(alice)
    older = _queue(kb, ("doc", "version one"))
    newer = _queue(kb, ("doc", "version two"))
    # The newer job's task happens to run first: it runs the older job before it.
    assert run_ingest_job(str(newer.pk)) == "succeeded"
    older.refresh_from_db()
    assert (
        older.status == "succeeded"
        and older.finished_at <= IngestJob.objects.get(pk=newer.pk).finished_at
    )
    assert Chunk.objects.get(knowledge_base=kb, source_key="doc#0").text == "version two"
    assert run_ingest_job(str(older.pk)) == "succeeded"  # nothing left to do
    assert Chunk.objects.get(knowledge_base=kb, source_key="doc#0").text == "version two"


def test_a_synchronous_batch_queues_behind_pending_jobs(alice, alice_client, settings):
    settings.INGEST_SYNC_MAX_CHARS = 100_000
    kb = make_kb(alice)
    queued = _queue(kb, ("doc", "version one"))
    url = f"/api/v1/knowledge-bases/{kb.pk}/documents"
    body = {"documents": [{"text": "version two", "source_key": "doc"}], "background": False}
    response = alice_client.post(url, body, format="json")
    assert response.status_code == 202
    assert _keys(kb) == []
    knowledge_ingest_job_run(job_id=str(queued.pk))
    assert Chunk.objects.get(knowledge_base=kb, source_key="doc#0").text == "version two"
    assert alice_client.post(url, body, format="json").status_code == 201  # queue empty again


def test_a_runner_holding_the_base_makes_others_return(alice):
    kb = make_kb(alice)
    job = _queue(kb, ("a", "text a"))
    params = connection.get_connection_params()
    holder = psycopg.connect(
        host=params["host"],
        port=params["port"],
        user=params["user"],
        dbname=params["dbname"],
        autocommit=True,
    )
    try:
        holder.execute("SELECT pg_advisory_lock(%s)", [_lock_id(f"knowledge:ingest-jobs:{kb.pk}")])
        assert run_ingest_job(str(job.pk)) == "queued"
    finally:
        holder.close()  # the lock goes with the session, once the server notices
    deadline = time.monotonic() + 10
    while (outcome := run_ingest_job(str(job.pk))) == "queued" and time.monotonic() < deadline:
        time.sleep(0.05)  # the holder's backend may take a moment to exit on a busy machine
    assert outcome == "succeeded"


def test_a_time_limit_marks_the_job_interrupted(alice, monkeypatch):
    kb = make_kb(alice)
    job = _queue(kb, ("a", "text a"))

    class TimeLimit(SystemExit):  # what django-q raises in a task past its timeout
        pass

    def stopped(**kwargs):
        raise TimeLimit()

    monkeypatch.setattr(services, "knowledge_base_ingest", stopped)
    with pytest.raises(TimeLimit):
        knowledge_ingest_job_run(job_id=str(job.pk))
    job.refresh_from_db()
    assert job.status == "failed" and job.error.startswith("interrupted: TimeLimit")
    assert job.attempts == 1 and _keys(kb) == []


def test_an_abandoned_job_is_resumed_by_the_sweep_and_given_up_after_three_tries(alice):
    from datetime import timedelta

    from django.utils import timezone

    from knowledge.services import knowledge_ingest_jobs_sweep

    kb = make_kb(alice)
    fresh = _queue(make_kb(alice, name="other"), ("b", "text b"))
    lost = _queue(kb, ("a", "text a"))
    long_ago = timezone.now() - timedelta(hours=1)
    # A worker died mid-run: "running", started an hour ago, nobody holds the base.
    IngestJob.objects.filter(pk=lost.pk).update(status="running", started_at=long_ago, attempts=1)
    assert knowledge_ingest_jobs_sweep() == 1
    lost.refresh_from_db()
    assert (lost.status, lost.attempts) == ("succeeded", 2)
    assert IngestJob.objects.get(pk=fresh.pk).status == "queued"  # not stale: its task will come

    again = _queue(kb, ("c", "text c"))
    IngestJob.objects.filter(pk=again.pk).update(status="running", started_at=long_ago, attempts=3)
    assert knowledge_ingest_jobs_sweep() == 1
    again.refresh_from_db()
    assert again.status == "failed" and "interrupted 3 times" in again.error
    assert sorted(_keys(kb)) == ["a#0"]


def test_a_bad_timestamp_in_a_background_batch_is_a_400_and_no_job(alice, alice_client, settings):
    settings.INGEST_SYNC_MAX_CHARS = 0
    kb = make_kb(alice)
    body = {"documents": [{"text": "t", "source_key": "k", "metadata": {"timestamp": "yesterday"}}]}
    response = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents", body, format="json")
    assert response.status_code == 400
    assert "ISO 8601" in response.json()["error"]["message"]
    assert not IngestJob.objects.exists()


@pytest.mark.parametrize("when", ["2026-13-01T00:00:00Z", "2026-01-01T00:00:00+25:00"])
def test_a_timestamp_shaped_as_one_but_no_time_is_a_400(alice, alice_client, when):
    """The shape of an ISO 8601 time with a 13th month or an offset of 25 hours: a 500."""
    kb = make_kb(alice)
    body = {"documents": [{"text": "t", "source_key": "k", "metadata": {"timestamp": when}}]}
    response = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents", body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert f"metadata timestamp {when!r} is not an ISO 8601 date-time" in error["message"]
    assert not IngestJob.objects.exists() and not kb.chunks.exists()


def test_the_job_sweep_is_registered():
    from django_q.models import Schedule

    sweep = Schedule.objects.get(name="ingest-jobs-sweep")
    assert (sweep.func, sweep.schedule_type, sweep.minutes) == (
        "knowledge.tasks.ingest_jobs_sweep",
        Schedule.MINUTES,
        5,
    )


@pytest.mark.django_db(transaction=True)
def test_a_job_accepted_during_a_synchronous_write_lands_after_it(monkeypatch):
    """The synchronous batch (accepted first) is still embedding when a background
    batch for the same document arrives and a worker (another connection) picks its
    job up at once: the job must wait for the synchronous write, or the older text
    would win."""
    import threading

    from knowledge.services import knowledge_documents_submit
    from tests.factories import UserFactory

    kb = make_kb(UserFactory(username="gail"))
    queued_again = []
    monkeypatch.setattr(
        services, "_enqueue_ingest_job", lambda job, **kw: queued_again.append(job.pk)
    )
    original = services.knowledge_base_ingest
    worker_saw = []

    def worker(job_pk):
        try:
            worker_saw.append(run_ingest_job(str(job_pk)))
        finally:
            connection.close()

    def slow_sync_write(*, knowledge_base, documents):
        if not worker_saw:  # the synchronous write (later calls are the job's own)
            job = _queue(kb, ("doc", "version two (accepted second)"))
            thread = threading.Thread(target=worker, args=(job.pk,))
            thread.start()
            thread.join()
        return original(knowledge_base=knowledge_base, documents=documents)

    monkeypatch.setattr(services, "knowledge_base_ingest", slow_sync_write)
    result = knowledge_documents_submit(
        knowledge_base=kb,
        documents=[services.DocumentIn(text="version one (accepted first)", source_key="doc")],
        background=False,
    )
    assert result.chunks_written == 1
    job = IngestJob.objects.get()
    assert worker_saw == ["queued"]  # the base was busy: the job was left queued
    text = Chunk.objects.get(knowledge_base=kb, source_key="doc#0").text
    assert text == "version one (accepted first)"
    # Once the lock was let go, the job was queued again; its run writes the newer text.
    assert queued_again == [job.pk, job.pk]  # at creation, and after the write
    assert run_ingest_job(str(job.pk)) == "succeeded"
    text = Chunk.objects.get(knowledge_base=kb, source_key="doc#0").text
    assert text == "version two (accepted second)"


def test_a_synchronous_write_that_committed_answers_201_if_the_database_goes_right_after(
    alice, alice_client, monkeypatch
):
    """The look for jobs accepted meanwhile runs after the write committed: a database
    gone by then must not turn the committed write into a 503 (the client would send it
    again); a job left waiting is the sweep's."""
    kb = make_kb(alice)
    real_filter = IngestJob.objects.filter

    def gone(*args, **kwargs):
        if Chunk.objects.filter(knowledge_base=kb).exists():  # the look after the write
            # As Django raises it: its OperationalError from psycopg's.
            cause = psycopg.OperationalError("server closed the connection unexpectedly")
            raise OperationalError(str(cause)) from cause
        return real_filter(*args, **kwargs)

    monkeypatch.setattr(IngestJob.objects, "filter", gone)
    reply = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents", _batch(2), format="json"
    )
    assert reply.status_code == 201, reply.json()
    assert reply.json()["chunks_written"] == 2
    assert _keys(kb) == ["d0#0", "d1#0"]
