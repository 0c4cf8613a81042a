"""Memory Base capture, trigger and exactly-once ingestion."""

from __future__ import annotations

import threading

import pytest

from core.errors import InvalidInput
from core.providers.errors import ProviderError
from ingestion import memory_bases as runner
from ingestion.memory_bases import session_ingest_run
from knowledge.models import Chunk, KnowledgeBase
from knowledge.services import ingest as kb_services
from memories.bases import services
from memories.bases.models import MemoryBase, MemoryBaseJob, MemoryBaseSession
from memories.bases.selectors import memory_base_mismatch
from memories.bases.services import (
    JobConflict,
    MemoryBaseError,
    memory_base_delete,
    memory_base_flush,
    memory_base_regenerate,
    memory_base_update,
    messages_record,
    session_ingest_enqueue,
    session_messages_delete,
)
from memories.conversations.models import Message
from memories.conversations.services import MessageIn, UnknownParent
from tests.conftest import jobs_logged, record

# on_commit callbacks (enqueue, dispatch) must really run: transactional tests.
pytestmark = pytest.mark.django_db(transaction=True)


def _chunks(mb):
    return sorted(
        Chunk.objects.filter(knowledge_base=mb.knowledge_base).values_list("source_key", flat=True)
    )


def _session(mb, session_id):
    return MemoryBaseSession.objects.get(memory_base=mb, session_id=session_id)


@pytest.fixture
def hold_dispatch(monkeypatch):
    """Queue jobs without running them (as if no worker had picked them up yet)."""
    monkeypatch.setattr(services, "_dispatch", lambda job: None)


def test_memory_base_creates_a_flagged_knowledge_base(memory_base):
    kb = memory_base.knowledge_base
    assert kb.is_memory_base is True
    assert kb.name == "Memory: support-memory" == memory_base.kb_name


def test_threshold_triggers_per_session_not_across_sessions(flow, memory_base):
    record(flow, "s1", "a1", "a2")
    record(flow, "s2", "b1", "b2")
    assert _chunks(memory_base) == []  # 2 + 2 outputs, but 2 < 3 in each session
    assert not MemoryBaseJob.objects.exists()
    stored = record(flow, "s1", "a3")
    ids = [m.pk for m in Message.objects.filter(session_id="s1").order_by("id")]
    assert _chunks(memory_base) == sorted(f"message:{i}#0" for i in ids)
    s1 = _session(memory_base, "s1")
    assert (s1.cursor_message_id, s1.total_processed) == (stored[-1].pk, 3)
    assert s1.last_sync_at is not None
    assert _session(memory_base, "s2").total_processed == 0
    job = MemoryBaseJob.objects.get()
    assert (job.status, job.trigger, job.messages_processed) == ("succeeded", "auto", 3)


def test_user_messages_are_not_outputs(flow, memory_base):
    messages_record(
        flow=flow,
        session_id="s1",
        run_id="r1",
        messages=[
            MessageIn(role="user", text="q1"),
            MessageIn(role="assistant", text="a1"),
            MessageIn(role="user", text="q2", is_output=True),
        ],
    )
    outputs = list(
        Message.objects.filter(is_output=True).values_list("text", flat=True).order_by("id")
    )
    assert outputs == ["a1", "q2"]


def test_manual_flush_below_threshold(flow, memory_base):
    record(flow, "s1", "only one")
    jobs = memory_base_flush(memory_base=memory_base)
    assert [j.session.session_id for j in jobs] == ["s1"]
    assert len(_chunks(memory_base)) == 1
    assert memory_base_flush(memory_base=memory_base) == []  # nothing pending: no job


def test_crash_after_chunks_before_cursor_then_rerun_has_no_duplicates(
    flow, memory_base, monkeypatch
):
    record(flow, "s1", "m1", "m2")

    def crash(*args, **kwargs):
        raise RuntimeError("worker killed after the chunk commit")

    monkeypatch.setattr(runner, "session_cursor_advance", crash)
    (job,) = memory_base_flush(memory_base=memory_base)
    job.refresh_from_db()
    assert job.status == "failed" and "worker killed" in job.error
    written = _chunks(memory_base)
    assert len(written) == 2  # the chunks did commit
    assert _session(memory_base, "s1").cursor_message_id is None  # the cursor did not move

    monkeypatch.undo()
    memory_base_flush(memory_base=memory_base)
    assert _chunks(memory_base) == written  # same rows, no duplicates
    session = _session(memory_base, "s1")
    assert session.total_processed == 2
    memory_base.knowledge_base.refresh_from_db()
    assert memory_base.knowledge_base.chunk_count == 2


def test_embedding_failure_keeps_cursor_and_retry_ingests_once(flow, memory_base, monkeypatch):
    record(flow, "s1", "m1", "m2")

    class Down:
        def embed(self, texts):
            raise ProviderError("embedding endpoint down")

    monkeypatch.setattr(kb_services, "kb_embedder", lambda kb: Down())
    (job,) = memory_base_flush(memory_base=memory_base)
    job.refresh_from_db()
    assert job.status == "failed" and "embedding endpoint down" in job.error
    assert _chunks(memory_base) == []
    assert _session(memory_base, "s1").cursor_message_id is None

    monkeypatch.undo()
    memory_base_flush(memory_base=memory_base)
    assert len(_chunks(memory_base)) == 2
    assert _session(memory_base, "s1").total_processed == 2


def test_second_trigger_gets_conflict_naming_the_active_job(flow, memory_base, hold_dispatch):
    record(flow, "s1", "m1")
    (first,) = memory_base_flush(memory_base=memory_base)
    with pytest.raises(JobConflict) as info:
        memory_base_flush(memory_base=memory_base, session_id="s1")
    assert info.value.job.pk == first.pk
    assert str(first.pk) in str(info.value)
    assert MemoryBaseJob.objects.count() == 1


def test_concurrent_triggers_make_one_job_and_one_conflict(flow, memory_base, hold_dispatch):
    from django.db import connection

    record(flow, "s1", "m1")
    session = memory_base.sessions.get() if memory_base.sessions.exists() else None
    session = session or services.memory_base_session_ensure(
        memory_base=memory_base, session_id="s1"
    )
    barrier = threading.Barrier(2)
    outcomes = []

    def trigger():
        try:
            barrier.wait()
            outcomes.append(session_ingest_enqueue(session=session, trigger="manual").pk)
        except JobConflict as exc:
            outcomes.append(("conflict", exc.job.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=trigger) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    job = MemoryBaseJob.objects.get()
    assert sorted(outcomes, key=str) == sorted([job.pk, ("conflict", job.pk)], key=str)


def test_an_auto_trigger_meeting_a_job_that_just_finished_queues_again(
    flow, memory_base, hold_dispatch, monkeypatch, caplog
):
    """The insert meets the session's active job, which finishes before the look that
    names it: the trigger queues its job again at once, and logs no error."""
    record(flow, "s1", "m1", "m2", "m3")  # queues a job (held)
    first = MemoryBaseJob.objects.get()
    looked = services.session_active_job

    def finished_meanwhile(*, session):
        MemoryBaseJob.objects.filter(pk=first.pk).update(status=MemoryBaseJob.Status.SUCCEEDED)
        monkeypatch.setattr(services, "session_active_job", looked)
        return None

    monkeypatch.setattr(services, "session_active_job", finished_meanwhile)
    caplog.set_level("INFO", logger="memories.bases.services")
    record(flow, "s1", "m4")
    jobs = list(MemoryBaseJob.objects.order_by("created_at").values_list("status", flat=True))
    assert jobs == [MemoryBaseJob.Status.SUCCEEDED, MemoryBaseJob.Status.QUEUED]
    assert [r.levelname for r in caplog.records if r.name == "memories.bases.services"] == []


def test_auto_trigger_conflict_does_not_lose_the_run(flow, memory_base, hold_dispatch):
    record(flow, "s1", "m1", "m2", "m3")  # queues a job (held)
    stored = record(flow, "s1", "m4")  # would trigger again: conflict, logged
    assert Message.objects.filter(session_id="s1").count() == 4
    assert stored[0].text == "m4"
    assert MemoryBaseJob.objects.count() == 1


@pytest.mark.parametrize("run", ["task", "sweep"])
def test_outputs_captured_while_a_job_is_active_are_ingested_when_it_ends(
    flow, memory_base, monkeypatch, run
):
    """Threshold 3, ten one-output runs: the third queues a job; the seven captured while
    it is active meet it (one active job per session) and queue none. When it ends (run
    by its task, or by the sweep after the task was lost), the seven pending reach the
    threshold and the next job runs: all ten are ingested, each once, with no flush."""
    from ingestion import tasks

    monkeypatch.setattr(services, "_dispatch", lambda job: None)  # not picked up yet
    for i in range(10):
        record(flow, "s1", f"output {i}", run_id=f"r{i}")
    first = MemoryBaseJob.objects.get()
    assert first.status == MemoryBaseJob.Status.QUEUED
    monkeypatch.undo()  # the next job is dispatched (and runs: tasks are inline in tests)
    if run == "task":
        assert tasks.ingest_session(str(first.pk)) == MemoryBaseJob.Status.SUCCEEDED
    else:
        assert runner.memory_base_jobs_sweep(stale_seconds=0) == 1
    ids = Message.objects.filter(session_id="s1").values_list("pk", flat=True)
    assert _chunks(memory_base) == sorted(f"message:{i}#0" for i in ids)
    session = _session(memory_base, "s1")
    assert (session.total_processed, services.session_pending_count(session=session)) == (10, 0)
    jobs = MemoryBaseJob.objects.order_by("created_at").values_list(
        "trigger", "status", "messages_processed"
    )
    assert list(jobs) == [("auto", "succeeded", 3), ("auto", "succeeded", 7)]
    memory_base.knowledge_base.refresh_from_db()
    assert memory_base.knowledge_base.chunk_count == 10


def test_concurrent_one_output_runs_are_all_ingested_once(flow, memory_base):
    """Ten concurrent one-output runs, threshold 3 (tasks inline: a run's trigger runs
    its job): however their triggers meet the active jobs, all ten end ingested, each
    once, no job left active and no flush."""
    from django.db import connection

    barrier = threading.Barrier(10)

    def run(i):
        try:
            barrier.wait()
            record(flow, "s1", f"output {i}", run_id=f"r{i}")
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ids = Message.objects.filter(session_id="s1").values_list("pk", flat=True)
    assert _chunks(memory_base) == sorted(f"message:{i}#0" for i in ids)
    assert _session(memory_base, "s1").total_processed == 10
    assert not MemoryBaseJob.objects.filter(status__in=MemoryBaseJob.ACTIVE).exists()
    assert sum(MemoryBaseJob.objects.values_list("messages_processed", flat=True)) == 10


def test_a_job_ending_below_the_threshold_queues_none(flow, memory_base, hold_dispatch):
    """What a job leaves pending below the threshold waits for the next trigger."""
    record(flow, "s1", "m1", "m2", "m3")
    first = MemoryBaseJob.objects.get()
    record(flow, "s1", "m4", "m5")  # met the active job
    session_ingest_run(job_id=first.pk)
    assert list(MemoryBaseJob.objects.values_list("status", flat=True)) == ["succeeded"]
    assert services.session_pending_count(session=_session(memory_base, "s1")) == 2


def test_run_is_stored_even_when_enqueueing_fails(flow, memory_base, monkeypatch):
    def broken(job):
        raise ConnectionError("broker unavailable")

    monkeypatch.setattr(services, "_dispatch", broken)
    record(flow, "s1", "m1", "m2", "m3")
    assert Message.objects.filter(session_id="s1").count() == 3
    assert _chunks(memory_base) == []


def test_threshold_change_does_not_alter_a_queued_job(flow, memory_base, hold_dispatch):
    record(flow, "s1", "m1", "m2", "m3")  # threshold 3: job queued with scope m1..m3
    job = MemoryBaseJob.objects.get()
    memory_base_update(memory_base=memory_base, threshold=100)
    record(flow, "s1", "m4", "m5")  # conflict while queued; scope stays m1..m3
    session_ingest_run(job_id=job.pk)
    job.refresh_from_db()
    assert (job.status, job.messages_processed) == ("succeeded", 3)
    session = _session(memory_base, "s1")
    assert session.total_processed == 3
    assert services.session_pending_count(session=session) == 2
    record(flow, "s1", "m6")  # 3 pending < new threshold 100: no new job
    assert MemoryBaseJob.objects.count() == 1


def test_delete_during_running_sync_stops_job_and_leaves_nothing(flow, memory_base, monkeypatch):
    from django.db import connection

    record(flow, "s1", *[f"m{i}" for i in range(2)])
    started, release = threading.Event(), threading.Event()
    real = kb_services.kb_embedder

    class Slow:
        def embed(self, texts):
            started.set()
            release.wait(10)
            return real(memory_base.knowledge_base).embed(texts)

    monkeypatch.setattr(kb_services, "kb_embedder", lambda kb: Slow())
    monkeypatch.setattr(services, "_dispatch", lambda job: None)
    (job,) = memory_base_flush(memory_base=memory_base)
    worker = threading.Thread(
        target=lambda: (session_ingest_run(job_id=job.pk), connection.close())
    )
    worker.start()
    assert started.wait(10)
    deleter = threading.Thread(
        target=lambda: (memory_base_delete(memory_base=memory_base), connection.close())
    )
    deleter.start()
    # The delete asks for cancellation and waits for the running job.
    for _ in range(100):
        if MemoryBaseJob.objects.filter(pk=job.pk, cancel_requested=True).exists():
            break
        threading.Event().wait(0.02)
    release.set()
    worker.join(10)
    deleter.join(20)
    assert not MemoryBase.objects.exists()
    assert not KnowledgeBase.objects.exists()
    assert not Chunk.objects.exists()
    assert not MemoryBaseJob.objects.exists()
    assert Message.objects.count() == 2  # the flow's messages are not the memory base's


def test_a_job_whose_chat_is_erased_as_it_starts_ends_quietly(
    flow, memory_base, hold_dispatch, monkeypatch, caplog
):
    """The session (and its job with it) is deleted once the run has claimed the job: the
    run ends on the vanished session, logged at INFO without a traceback."""
    record(flow, "s1", "m1", "m2", "m3")
    job = MemoryBaseJob.objects.get()
    claim = runner.job_claim

    def erased_meanwhile(*args, **kwargs):
        claimed = claim(*args, **kwargs)
        session_messages_delete(flow=flow, session_id="s1")
        return claimed

    monkeypatch.setattr(runner, "job_claim", erased_meanwhile)
    caplog.set_level("INFO", logger="core.jobs")
    assert session_ingest_run(job_id=job.pk) is None
    assert not MemoryBaseJob.objects.exists() and _chunks(memory_base) == []
    assert jobs_logged(caplog) == [
        ("INFO", None, f"memory base job {job.pk} ended: MemoryBaseSession matching query "
         "does not exist. (deleted meanwhile)"),
    ]  # fmt: skip


def test_a_does_not_exist_of_a_job_still_there_is_an_error(
    flow, memory_base, hold_dispatch, monkeypatch, caplog
):
    """Only a job gone with what it worked on ends quietly: otherwise the same exception
    is a failure, logged as an error with its traceback."""
    record(flow, "s1", "m1", "m2", "m3")
    job = MemoryBaseJob.objects.get()

    def broken(job, progress):
        raise MemoryBaseSession.DoesNotExist("a bug")

    monkeypatch.setattr(runner, "_ingest", broken)
    session_ingest_run(job_id=job.pk)
    job.refresh_from_db()
    assert (job.status, job.error) == ("failed", "DoesNotExist: a bug")
    (error,) = [r for r in caplog.records if r.name == "core.jobs"]
    assert error.levelname == "ERROR" and error.exc_info is not None


def test_mismatch_and_regenerate_rebuild_the_same_chunks(flow, memory_base):
    record(flow, "s1", "alpha " * 300, "beta")  # a long message makes several chunks
    record(flow, "s2", "gamma", "delta", "epsilon")
    memory_base_flush(memory_base=memory_base)
    before = _chunks(memory_base)
    assert len(before) > 5
    assert memory_base_mismatch(memory_base=memory_base) is False
    Chunk.objects.filter(knowledge_base=memory_base.knowledge_base).delete()  # behind our back
    assert memory_base_mismatch(memory_base=memory_base) is True
    jobs = memory_base_regenerate(memory_base=memory_base)
    assert sorted(j.session.session_id for j in jobs) == ["s1", "s2"]
    assert _chunks(memory_base) == before
    assert memory_base_mismatch(memory_base=memory_base) is False
    assert [s.total_processed for s in memory_base.sessions.order_by("session_id")] == [2, 3]


def test_regenerate_refuses_while_a_job_is_active(flow, memory_base, hold_dispatch):
    record(flow, "s1", "m1")
    memory_base_flush(memory_base=memory_base)
    with pytest.raises(JobConflict):
        memory_base_regenerate(memory_base=memory_base)


def test_deleting_a_session_purges_its_chunks(flow, memory_base):
    record(flow, "s1", "one", "two", "three")
    record(flow, "s2", "four", "five", "six")
    assert session_messages_delete(flow=flow, session_id="s1") == 3
    texts = set(Chunk.objects.values_list("text", flat=True))
    assert texts == {"four", "five", "six"}
    assert not MemoryBaseSession.objects.filter(session_id="s1").exists()
    memory_base.knowledge_base.refresh_from_db()
    assert memory_base.knowledge_base.chunk_count == 3


def test_preprocessing_distils_and_kill_phrase_advances_cursor(
    flow, alice, llm_settings, openai_server
):
    from tests.fakes.openai_server import Scripted, chat_body

    mb = services.memory_base_create(
        owner=alice,
        name="distilled",
        flow=flow,
        threshold=100,
        preprocess=True,
        preprocess_kill_phrase="NOTHING_TO_STORE",
    )
    openai_server.push(Scripted(body=chat_body("User prefers dark mode.")))
    record(flow, "s1", "I like dark mode", "Noted!")
    memory_base_flush(memory_base=mb)
    assert list(
        Chunk.objects.filter(knowledge_base=mb.knowledge_base).values_list("text", flat=True)
    ) == ["User prefers dark mode."]
    sent = openai_server.requests[0]["json"]["messages"]
    assert "NOTHING_TO_STORE" in sent[0]["content"]
    assert sent[1]["content"] == "assistant: I like dark mode\nassistant: Noted!"

    openai_server.push(Scripted(body=chat_body("NOTHING_TO_STORE")))
    record(flow, "s1", "ok bye")
    memory_base_flush(memory_base=mb)
    assert Chunk.objects.filter(knowledge_base=mb.knowledge_base).count() == 1
    assert _session(mb, "s1").total_processed == 3
    # Both calls counted for the owner as Memory Base preprocessing (issue 29).
    from core.models import UsageDay

    counted = UsageDay.objects.filter(owner=alice).values_list("kind", "subject", "calls")
    assert list(counted) == [("memory_base", f"memory base {mb.pk}", 2)]


def test_bad_input_stores_nothing(flow, memory_base):
    with pytest.raises(InvalidInput):  # MemoryBaseError is one too
        messages_record(
            flow=flow,
            session_id="bad id with spaces",
            run_id="r",
            messages=[MessageIn(role="assistant", text="x")],
        )
    with pytest.raises(InvalidInput):
        messages_record(flow=flow, session_id="s1", run_id="r", messages=[])
    with pytest.raises(UnknownParent):
        messages_record(
            flow=flow,
            session_id="s1",
            run_id="r",
            messages=[MessageIn(role="assistant", text="x", parent=999999)],
        )
    with pytest.raises(MemoryBaseError):
        memory_base_update(memory_base=memory_base, threshold=0)
    assert not Message.objects.exists()
    memory_base.refresh_from_db()
    assert memory_base.threshold == 3


def test_a_chunk_names_the_callers_message_id(flow, memory_base, alice_client):
    """One shape per field: a chunk's metadata.message_id is the id the caller gave the
    message (else the server's), as every other answer names the message."""
    for message_id, text in (("caller-msg-7", "Invoices are due in 30 days."), (None, "No id.")):
        body = {"flow": str(flow.pk), "session_id": "s1", "role": "assistant", "content": text}
        if message_id:
            body["message_id"] = message_id
        assert alice_client.post("/api/v1/messages", body, format="json").status_code == 201
    memory_base_flush(memory_base=memory_base)
    from knowledge.models import Chunk
    from memories.conversations.models import Message

    plain = Message.objects.get(text="No id.")
    assert sorted(Chunk.objects.values_list("text", "message_id")) == [
        ("Invoices are due in 30 days.", "caller-msg-7"), ("No id.", str(plain.pk)),
    ]  # fmt: skip
