"""Memory Base jobs share the one job lifecycle (core.jobs): a worker killed mid-run
leaves the job running; the sweep resumes it, nothing is lost or written twice,
and the session takes the next flush."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.conf import settings

from ingestion import memory_bases as runner
from ingestion.memory_bases import memory_base_jobs_sweep
from knowledge.models import Chunk
from memories.bases import services
from memories.bases.models import MemoryBaseJob, MemoryBaseSession
from memories.bases.services import session_ingest_enqueue
from memories.conversations.models import Message
from tests.conftest import record

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import sys, time
    import django
    django.setup()
    from core import tenancy
    tenancy.set_fallback(("", "test worker"))  # (django-q2 would run it as the job's owner)
    from ingestion import memory_bases
    from knowledge.services import ingest as kb_services
    from ingestion.tasks import ingest_session

    memory_bases.INGEST_BATCH_MESSAGES = 2
    real = kb_services.kb_embedder

    class Slow:
        def __init__(self, inner):
            self.inner = inner

        def embed(self, texts):
            time.sleep(1.0)
            return self.inner.embed(texts)

    kb_services.kb_embedder = lambda kb: Slow(real(kb))
    print("started", flush=True)
    ingest_session(sys.argv[1])
    """
)


def _worker(job_id: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="memoryproject.settings_test",
        EMBEDDED_DB_NAME=settings.DATABASES["default"]["NAME"],
    )
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, job_id],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_killed_worker_job_is_resumed_by_the_sweep(flow, alice, alice_client, monkeypatch):
    from memories.bases.services import memory_base_create

    mb = memory_base_create(owner=alice, name="kill", flow=flow, threshold=100)
    record(flow, "s1", *[f"answer {i}" for i in range(6)])
    session = MemoryBaseSession.objects.get(memory_base=mb, session_id="s1")
    monkeypatch.setattr(services, "_dispatch", lambda job: None)  # the worker below runs it
    job = session_ingest_enqueue(session=session, trigger=MemoryBaseJob.Trigger.MANUAL)

    worker = _worker(str(job.pk))
    try:
        # Kill -9 once the first batch (2 messages) is committed, mid-way through the run.
        _wait(lambda: MemoryBaseJob.objects.get(pk=job.pk).messages_processed >= 2)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("running", 1)
    done = job.messages_processed
    assert 2 <= done < 6
    url = f"/api/v1/memories/{mb.pk}/flush"
    refused = alice_client.post(url, {"session_id": "s1"}, format="json")
    assert refused.status_code == 409  # the dead run still holds the session

    # The dead worker's connection (and its run lock) goes away with it.
    _wait(lambda: memory_base_jobs_sweep(stale_seconds=0) or job_done(job), timeout=30)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.messages_processed) == ("succeeded", 2, 6)
    ids = Message.objects.filter(session_id="s1").order_by("id").values_list("pk", flat=True)
    keys = Chunk.objects.filter(knowledge_base=mb.knowledge_base).values_list(
        "source_key", flat=True
    )
    assert sorted(keys) == sorted(f"message:{i}#0" for i in ids)  # none lost, none twice
    session.refresh_from_db()
    assert (session.total_processed, session.cursor_message_id) == (6, ids[5])
    mb.knowledge_base.refresh_from_db()
    assert mb.knowledge_base.chunk_count == 6

    monkeypatch.undo()  # jobs run again as queued (inline in tests)
    record(flow, "s1", "after the crash")
    accepted = alice_client.post(url, {"session_id": "s1"}, format="json")
    assert accepted.status_code == 202
    assert Chunk.objects.filter(knowledge_base=mb.knowledge_base).count() == 7


def job_done(job: MemoryBaseJob) -> bool:
    return MemoryBaseJob.objects.get(pk=job.pk).status not in MemoryBaseJob.ACTIVE


def test_sweep_gives_up_after_the_attempts_and_frees_the_session(flow, alice):
    from memories.bases.services import memory_base_create

    mb = memory_base_create(owner=alice, name="gives-up", flow=flow, threshold=100)
    record(flow, "s1", "one")
    session = MemoryBaseSession.objects.get(memory_base=mb, session_id="s1")
    job = MemoryBaseJob.objects.create(
        memory_base=mb,
        session=session,
        trigger="manual",
        status="running",
        attempts=MemoryBaseJob.MAX_ATTEMPTS,
        last_message_id=Message.objects.get().pk,
        last_message_created_at=Message.objects.get().created_at,
    )
    assert memory_base_jobs_sweep(stale_seconds=0) == 0
    job.refresh_from_db()
    assert job.status == "failed" and "interrupted 3 times" in job.error
    assert Chunk.objects.filter(knowledge_base=mb.knowledge_base).count() == 0
    assert services.memory_base_flush(memory_base=mb, session_id="s1")  # accepted


def test_a_time_limit_records_the_run_interrupted(flow, alice, monkeypatch):
    from memories.bases.services import memory_base_create

    class TimeLimit(SystemExit):
        pass

    def cut(*args, **kwargs):
        raise TimeLimit()

    mb = memory_base_create(owner=alice, name="cut", flow=flow, threshold=100)
    record(flow, "s1", "one")
    monkeypatch.setattr(runner, "knowledge_base_ingest", cut)
    with pytest.raises(TimeLimit):
        services.memory_base_flush(memory_base=mb, session_id="s1")
    job = MemoryBaseJob.objects.get()
    assert job.status == "failed" and job.error.startswith("interrupted: TimeLimit")
    monkeypatch.undo()
    assert services.memory_base_flush(memory_base=mb, session_id="s1")  # the slot is free
