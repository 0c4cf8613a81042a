"""Debounced updates survive a killed worker: a real worker process is killed (SIGKILL)
while its extraction is in flight, a new worker process takes over, and every flush
is extracted once: nothing lost, nothing done twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from ingestion import updates as pipeline
from memories.engine import files
from memories.engine.models import PendingUpdate
from memories.engine.updates import update_record
from memories.facts.models import Fact, FactChange
from memories.facts.scopes import scope_find
from tests.ingestion.test_job_lifecycle import _wait
from tests.memories.engine.scripted import EngineLLM, fact

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
SCOPE = ("user", "alice")
MESSAGES = {
    "I drink green tea every morning": [fact("User drinks green tea every morning", "behavior")],
    "I am learning Rust this year": [fact("User is learning Rust", "goal")],
    "Please use dark mode, always": [fact("User prefers dark mode")],
}

WORKER = textwrap.dedent(
    """
    import sys
    import django
    django.setup()
    from django.conf import settings
    settings.LLM_BASE_URL, settings.LLM_MODEL, settings.LLM_TIMEOUT = sys.argv[1], "fake-model", 60
    settings.STORAGES = {**settings.STORAGES, "engine_test": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": sys.argv[2]}}}
    settings.ENGINE_STORAGE = "engine_test"
    from ingestion.tasks import engine_updates_sweep
    print("started", flush=True)
    print("swept", engine_updates_sweep(), flush=True)
    """
)


def _worker(base_url: str, location: Path) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="memoryproject.settings_test",
        EMBEDDED_DB_NAME=settings.DATABASES["default"]["NAME"],
    )
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, base_url, str(location)], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _flush_three(alice) -> int:
    past = timezone.now() - timedelta(minutes=2)  # the window has closed: due
    for i, text in enumerate(MESSAGES):
        update = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": text}],
                               now=past + timedelta(seconds=i))  # fmt: skip
    return update.scope_id


def _extraction_requests(server) -> int:
    return sum("You maintain the long-term memory" in str(r["json"]) for r in server.requests)


@pytest.mark.slow
def test_worker_killed_mid_extraction_then_restarted(
    alice, openai_server, engine_storage, llm_settings
):
    script = EngineLLM(MESSAGES)
    hang = {"on": True}

    def respond(payload):
        answer = script(payload)
        if hang["on"]:
            answer.delay = 30  # the first worker dies while waiting for this
        return answer

    openai_server.chat_fn = respond
    _flush_three(alice)

    first = _worker(openai_server.base_url, engine_storage)
    try:
        _wait(lambda: _extraction_requests(openai_server) == 1)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL
    # killed before its commit: every flush still pending, no fact, no audit row
    assert list(PendingUpdate.objects.values_list("status", flat=True)) == ["pending"] * 3
    assert Fact.objects.count() == 0 and FactChange.objects.count() == 0

    hang["on"] = False
    second = _worker(openai_server.base_url, engine_storage)  # the restarted worker
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "swept 1" in out  # its sweep found the abandoned scope (the lock died with the worker)

    assert _extraction_requests(openai_server) == 2  # the killed one and the one that finished
    assert sorted(Fact.objects.values_list("content", flat=True)) == [
        "User drinks green tea every morning", "User is learning Rust", "User prefers dark mode",
    ]  # fmt: skip
    rows = list(PendingUpdate.objects.values_list("status", "batch_id", "attempts"))
    assert len({r[1] for r in rows}) == 1 and {(r[0], r[2]) for r in rows} == {("done", 1)}
    assert FactChange.objects.filter(action="add").count() == 3
    row = scope_find(owner=alice, scope=SCOPE)
    journal = files.journal_read(owner_id=alice.pk, scope=row.path, day=timezone.now().date())
    assert journal.count("<!-- entry ") == 3

    # a third worker (or a duplicate delivery) finds nothing to do
    third = _worker(openai_server.base_url, engine_storage)
    out, err = third.communicate(timeout=120)
    assert "swept 0" in out, err
    assert _extraction_requests(openai_server) == 2 and Fact.objects.count() == 3


def test_a_crash_between_the_journal_and_the_commit_is_redone_once(alice, openai_server, engine_storage,
                                                                  llm_settings, monkeypatch):  # fmt: skip
    openai_server.chat_fn = EngineLLM(MESSAGES)
    scope_id = _flush_three(alice)

    def crash(**kwargs):
        raise KeyboardInterrupt  # what a dying worker looks like from inside the run

    monkeypatch.setattr(pipeline, "fact_add", crash)
    with pytest.raises(KeyboardInterrupt):
        pipeline.updates_run(scope_id=scope_id)
    row = scope_find(owner=alice, scope=SCOPE)
    day = PendingUpdate.objects.first().created_at.date()
    before = files.journal_read(owner_id=alice.pk, scope=row.path, day=day)
    assert before.count("<!-- entry ") == 3  # written before the commit
    assert set(PendingUpdate.objects.values_list("status", flat=True)) == {"pending"}
    assert Fact.objects.count() == 0

    monkeypatch.undo()
    run = pipeline.updates_run(scope_id=scope_id)
    assert (run.status, run.journal_entries) == ("done", 0)  # each entry already there
    assert files.journal_read(owner_id=alice.pk, scope=row.path, day=day) == before
    assert Fact.objects.count() == 3
