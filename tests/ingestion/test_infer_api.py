"""``POST /api/v1/users/{id}/memories`` with ``infer: true`` goes through the debounced
updates with a window of zero: the messages become a flush of ``["user", <id>]``, run at
once with whatever else the scope has pending (one extraction), and the answer keeps
its documented shape (the decisions) plus the flush."""

from __future__ import annotations

import pytest

from ingestion import updates as pipeline
from ingestion.tasks import form_memories
from ingestion.updates import updates_sweep
from memories.engine.models import PendingUpdate
from memories.facts.models import Fact
from tests.fakes.openai_server import Scripted
from tests.ingestion.conftest import DARK, TEA
from tests.memories.engine.scripted import scope_held

pytestmark = pytest.mark.django_db(transaction=True)
BASE = "/api/v1/users/alice/memories"


def test_infer_runs_the_scopes_pending_flushes_in_one_extraction(alice, alice_client, engine_llm):
    pending = form_memories(alice.pk, "alice", TEA, "2030-01-01T10:00:00+00:00")  # the proxy's
    assert PendingUpdate.objects.get(pk=pending).status == "pending"  # waiting its window

    response = alice_client.post(BASE, {"content": DARK}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert [(d["fact"], d["action"]) for d in body["decisions"]] == [
        ("User drinks green tea every morning", "add"),
        ("User prefers dark mode", "add"),
    ]
    assert engine_llm.calls["extraction"] == 1  # one call for both flushes
    rows = list(PendingUpdate.objects.order_by("id").values_list("source", "status", "batch_id"))
    assert [r[:2] for r in rows] == [("chat", "done"), ("api", "done")]
    assert rows[0][2] == rows[1][2] and body["update"]["batch_id"] == str(rows[1][2])
    assert body["update"]["id"] == PendingUpdate.objects.get(source="api").pk

    # nothing left for the sweep or the pending schedule: no second extraction
    assert updates_sweep() == 0
    assert pipeline.updates_run(scope_id=body_scope_id(), force=True).status == "empty"
    assert engine_llm.calls["extraction"] == 1 and Fact.objects.count() == 2


def body_scope_id() -> int:
    return PendingUpdate.objects.values_list("scope_id", flat=True).first()


def test_infer_while_another_run_holds_the_scope_leaves_the_flush_queued(
    alice, alice_client, engine_llm, monkeypatch
):
    alice_client.post(BASE, {"content": TEA}, format="json")  # the scope exists
    scope_id = body_scope_id()
    monkeypatch.setattr(pipeline, "INLINE_WAIT_SECONDS", 0.5)
    with scope_held(scope_id):
        response = alice_client.post(BASE, {"content": DARK}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["decisions"] == [] and body["update"]["status"] == "pending"
    assert engine_llm.calls["extraction"] == 1  # only the first request's
    assert updates_sweep() == 1  # due at once: the next sweep (or its queued run) does it
    assert PendingUpdate.objects.get(pk=body["update"]["id"]).status == "done"
    assert engine_llm.calls["extraction"] == 2
    assert sorted(Fact.objects.values_list("content", flat=True)) == [
        "User drinks green tea every morning", "User prefers dark mode",
    ]  # fmt: skip


def test_infer_when_the_llm_fails_keeps_the_flush_for_a_retry(
    alice, alice_client, engine_llm, openai_server
):
    openai_server.chat_fn = lambda payload: Scripted(status=500, body={"error": "down"})
    response = alice_client.post(BASE, {"content": TEA}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["decisions"] == []
    assert (body["update"]["status"], body["update"]["attempts"]) == ("pending", 1)
    assert body["update"]["error"]
    assert Fact.objects.count() == 0
