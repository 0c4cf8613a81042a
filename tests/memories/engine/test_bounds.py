"""Input at the edges the database and the file system set (a new user's audit,
2026-11-28): a time PostgreSQL stores but Python cannot read back, a day that does not
exist, an id whose file name is too long. Each is a 400 with nothing written, or works:
never a 500, and never a row or a scope no later request can read, change or erase."""

from __future__ import annotations

import pytest

from ingestion.updates import updates_run
from knowledge.models import Chunk
from knowledge.services.bases import knowledge_base_create
from memories.engine.models import PendingUpdate
from memories.facts.models import Fact, Scope
from tests.memories.engine.scripted import EngineLLM, fact

pytestmark = pytest.mark.django_db
SAID = "I prefer short answers"


@pytest.fixture
def engine_llm(llm_settings, openai_server, engine_storage):
    openai_server.chat_fn = EngineLLM(
        {SAID: [fact("User prefers short answers", "preference", 0.9)]},
        dream=lambda prompt: {"facts": [], "diary": "nothing to keep"},
    )
    return engine_storage


@pytest.mark.parametrize(
    "when",
    [
        "9999-12-31T23:59:59-05:00",  # the year 10000 in UTC: stored, then unreadable
        "9999-06-01T00:00:00Z",
        "1900-01-01T00:30:00+01:00",  # 1899 in UTC
        "0001-01-01T00:00:00+14:00",
    ],
)
def test_a_time_outside_the_stored_range_is_a_400(alice, alice_client, when):
    for field in ("valid_from", "valid_to"):
        body = {"scope": ["t", "time"], "content": "far", field: when}
        answer = alice_client.post("/api/v1/engine/facts", body, format="json")
        assert answer.status_code == 400, answer.content
        assert answer.json()["error"]["message"].startswith(f"{field} is not"), answer.json()
    kb = knowledge_base_create(owner=alice, name="docs")
    ingest = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents", {"documents": [
        {"text": "far", "metadata": {"timestamp": when}}]}, format="json")  # fmt: skip
    assert ingest.status_code == 400, ingest.content
    assert not Fact.objects.exists() and not Chunk.objects.exists()
    # The edges inside the range are kept, and read back.
    body = {"scope": ["t", "time"], "content": "edge", "valid_from": "1900-01-01T00:00:00Z",
            "valid_to": "9998-12-31T23:59:59+00:00"}  # fmt: skip
    made = alice_client.post("/api/v1/engine/facts", body, format="json")
    assert made.status_code == 201, made.content
    listed = alice_client.get("/api/v1/engine/facts", {"scope": '["t", "time"]'})
    assert listed.status_code == 200 and listed.json()["count"] == 1


def test_a_day_that_does_not_exist_is_a_400_and_a_stored_one_stops_nothing(
    alice, alice_client, engine_llm
):
    scope = ["org", "acme"]
    bad = {"scope": scope, "messages": [{"role": "user", "content": SAID,
                                         "at": "2026-02-30T10:00:00"}]}  # fmt: skip
    answer = alice_client.post("/api/v1/engine/flush", bad, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["message"].startswith("messages[0].at is not a date")
    assert not PendingUpdate.objects.exists()
    # A time without a zone is UTC, and stored with it.
    good = {"scope": scope, "messages": [{"role": "user", "content": SAID,
                                          "at": "2026-02-27T10:00:00"}]}  # fmt: skip
    assert alice_client.post("/api/v1/engine/flush", good, format="json").status_code == 202
    pending = PendingUpdate.objects.get()
    assert pending.messages[-1]["at"] == "2026-02-27T10:00:00+00:00"
    # A flush stored before the check (its day impossible) no longer fails its scope's runs.
    pending.messages = [{**pending.messages[-1], "at": "2026-02-30T10:00:00"}]
    pending.save()
    updates_run(scope_id=pending.scope_id, force=True)
    pending.refresh_from_db()
    assert pending.status == PendingUpdate.Status.DONE, (pending.status, pending.error)
    assert list(Fact.objects.values_list("content", flat=True)) == ["User prefers short answers"]


def test_the_longest_ids_are_learned_journaled_and_erased(
    alice, alice_client, engine_llm, django_capture_on_commit_callbacks
):
    user = "u" * 251 + ".com"  # 255 characters: a valid end-user id
    made = alice_client.post(f"/api/v1/users/{user}/memories",
                             {"text": "likes tea", "infer": False}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    scope = ["a" + "." * 200]  # its encoding, 601 bytes, is no file name
    flushed = alice_client.post("/api/v1/engine/flush", {"scope": scope, "messages": [
        {"role": "user", "content": SAID}]}, format="json")  # fmt: skip
    assert flushed.status_code == 202, flushed.content
    run = alice_client.post("/api/v1/engine/updates/run", {"scope": scope}, format="json")
    assert run.status_code == 200, run.content
    assert PendingUpdate.objects.get().status == PendingUpdate.Status.DONE
    journal = alice_client.get("/api/v1/engine/journal", {"scope": f'["a{"." * 200}"]'})
    assert journal.status_code == 200, journal.content
    assert len(journal.json()["days"]) == 1
    with django_capture_on_commit_callbacks(execute=True):  # (the files go on commit)
        erased = [
            alice_client.delete(f"/api/v1/users/{user}/memories"),
            alice_client.post("/api/v1/engine/erase", {"scope": scope}, format="json"),
        ]
    for erase in erased:
        assert erase.status_code == 200, erase.content
    assert not Fact.objects.exists()
    assert not Scope.objects.filter(external_id=user).exists()
    assert not [p for p in engine_llm.rglob("*") if p.is_file()]


def test_metadata_over_its_size_is_a_400_and_writes_nothing(alice, alice_client):
    """A fact's text is capped, its metadata was not: 9 MB were taken, then answered by
    every list and search (18 MB through MCP's search_memory, into a model's context)."""
    from core.api.fields import MAX_METADATA_BYTES

    kb = knowledge_base_create(owner=alice, name="docs")
    fits = {"note": "x" * (MAX_METADATA_BYTES - 20)}
    big = {"note": "é" * (MAX_METADATA_BYTES // 2)}  # (bytes counted: 2 per "é")
    body = {"scope": ["user", "meta"], "content": "User likes tea", "metadata": big}
    answer = alice_client.post("/api/v1/engine/facts", body, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["details"] == {"metadata": [  # ({"note": "..."} around it)
        f"Ensure this object has no more than {MAX_METADATA_BYTES} bytes as JSON "
        f"(it has {MAX_METADATA_BYTES + 12})."]}  # fmt: skip
    answer = alice_client.post("/api/v1/users/meta/memories", {
        "content": "User likes tea", "infer": False, "metadata": big}, format="json")  # fmt: skip
    assert answer.status_code == 400 and "metadata" in answer.json()["error"]["details"]
    answer = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents", {
        "documents": [{"text": "A document", "metadata": big}]}, format="json")  # fmt: skip
    assert answer.status_code == 400, answer.content
    assert not Fact.objects.exists() and not Chunk.objects.exists()
    assert not Scope.objects.filter(path=["user", "meta"]).exists()
    made = alice_client.post("/api/v1/engine/facts", {
        "scope": ["user", "meta"], "content": "User likes tea", "metadata": fits}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    assert Fact.objects.get().metadata == fits


def test_a_misspelt_field_of_an_engine_body_is_a_400_naming_it(alice, alice_client):
    """``"confidance": 0.3`` stored the fact at confidence 1.0 (0.3 was below the
    threshold: nothing would have been stored), ``"fliter"`` searched every fact."""
    made = alice_client.post("/api/v1/engine/facts", {
        "scope": ["user", "typo"], "content": "User maybe likes jazz", "confidance": 0.3,
    }, format="json")  # fmt: skip
    assert made.status_code == 400
    assert made.json()["error"]["details"] == {"confidance": ["Unknown field confidance."]}
    assert not Fact.objects.exists() and not Scope.objects.filter(path=["user", "typo"]).exists()
    searched = alice_client.post("/api/v1/engine/search", {
        "scope": ["user", "typo"], "query": "jazz", "fliter": {"category": "preference"},
    }, format="json")  # fmt: skip
    assert searched.status_code == 400
    assert searched.json()["error"]["details"] == {"fliter": ["Unknown field fliter."]}
    nested = alice_client.post("/api/v1/engine/search", {
        "scope": ["user", "typo"], "query": "jazz", "filter": {"categroy": "preference"},
    }, format="json")  # fmt: skip
    assert nested.status_code == 400
    assert nested.json()["error"]["details"] == {
        "filter": {"categroy": ["Unknown field categroy."]}
    }
    # the names each body documents, aliases included, are taken
    made = alice_client.post("/api/v1/engine/facts", {
        "scope": ["user", "typo"], "text": "User likes jazz", "confidence": 0.9,
        "category": "preference", "metadata": {}, "reason": "said so", "valid_from": None,
    }, format="json")  # fmt: skip
    assert made.status_code == 201, made.content

    fact_id = made.json()["fact"]["id"]
    patched = alice_client.patch(f"/api/v1/engine/facts/{fact_id}",
                                 {"confidance": 0.3}, format="json")  # fmt: skip
    assert patched.status_code == 400
    assert patched.json()["error"]["details"] == {"confidance": ["Unknown field confidance."]}
    assert Fact.objects.get(pk=fact_id).confidence == 0.9
