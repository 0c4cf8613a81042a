"""A document's source fields (the metadata keys stored in their own chunk columns) and
the search filters on them: what fits is stored, a timestamp without an offset is UTC,
and anything else is a 400 naming the field with nothing stored or queued, never a 500
(a new user's audit found 500s here)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from knowledge.models import Chunk, IngestJob
from knowledge.services.bases import knowledge_base_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def kb(alice):
    return knowledge_base_create(owner=alice, name="docs")


def _ingest(client, kb, metadata, **extra):
    body = {"documents": [{"text": "Refunds take five days.", "metadata": metadata}], **extra}
    return client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents", body, format="json")


@pytest.mark.parametrize(
    "given, stored",
    [
        ("2024-01-01T10:00:00", datetime(2024, 1, 1, 10, tzinfo=UTC)),
        ("2024-01-01", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-01-01T10:00:00+02:00", datetime(2024, 1, 1, 8, tzinfo=UTC)),
    ],
)
def test_a_timestamp_without_an_offset_is_utc(alice_client, kb, given, stored):
    answer = _ingest(alice_client, kb, {"timestamp": given, "session_id": "s1"})
    assert answer.status_code == 201, answer.content
    assert Chunk.objects.get().source_timestamp == stored
    found = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/search",
                              {"query": "refunds", "filters": {"since": given}}, format="json")  # fmt: skip
    assert [h["text"] for h in found.json()["results"]] == ["Refunds take five days."]


@pytest.mark.parametrize(
    "key, value",
    [
        ("session_id", "s" * 256),
        ("sender", "a" * 256),
        ("source_type", "t" * 33),
        ("flow_id", "f" * 65),
        ("run_id", "r" * 65),
        ("content_hash", "c" * 65),
        ("message_id", "m" * 201),
        ("sender", {"a": 1}),
        ("session_id", True),
        ("session_id", ["s1"]),
        ("timestamp", "not a date"),
        ("timestamp", 1700000000),
    ],
)
@pytest.mark.parametrize("background", [False, True])
def test_a_source_field_that_does_not_fit_is_a_400_and_nothing_is_stored(
    alice_client, kb, key, value, background
):
    answer = _ingest(alice_client, kb, {key: value}, background=background)
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error["code"] == "invalid"
    assert error["message"].startswith(f"documents[0].metadata.{key}:"), error["message"]
    assert not Chunk.objects.exists() and not IngestJob.objects.exists()


def test_a_whole_number_is_taken_as_its_digits_and_the_longest_values_fit(alice_client, kb):
    longest = {"session_id": "s" * 255, "sender": "a" * 255, "source_type": "t" * 32,
               "flow_id": "f" * 64, "run_id": "r" * 64, "content_hash": "c" * 64,
               "message_id": 42}  # fmt: skip
    answer = _ingest(alice_client, kb, longest)
    assert answer.status_code == 201, answer.content
    chunk = Chunk.objects.get()
    assert (chunk.message_id, chunk.session_id, chunk.source_type) == ("42", "s" * 255, "t" * 32)


@pytest.mark.parametrize("mode", ["hybrid", "keyword", "vector"])
def test_a_filter_no_chunk_could_hold_is_a_400(alice_client, kb, mode):
    assert _ingest(alice_client, kb, {"session_id": "s1"}).status_code == 201
    url = f"/api/v1/knowledge-bases/{kb.pk}/search"
    for filters in ({"session_id": "a" * 2010}, {"session_id": True}, {"sender": {"a": 1}},
                    {"source_type": "t" * 33}):  # fmt: skip
        answer = alice_client.post(url, {"query": "refunds", "mode": mode, "filters": filters},
                                   format="json")  # fmt: skip
        assert answer.status_code == 400, (filters, answer.content)
        assert answer.json()["error"]["message"].startswith("filters:")
    # The longest a chunk holds is searched.
    fits = alice_client.post(url, {"query": "refunds", "mode": mode,
                                   "filters": {"session_id": "a" * 255}}, format="json")  # fmt: skip
    assert fits.status_code == 200 and fits.json()["results"] == []


def test_an_empty_list_of_bases_searches_none(alice, alice_client, kb):
    assert _ingest(alice_client, kb, {}).status_code == 201
    body = {"query": "refunds", "knowledge_base_ids": [], "include_memory_bases": True}
    answer = alice_client.post("/api/v1/search", body, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["results"] == []
    everything = alice_client.post("/api/v1/search", {"query": "refunds"}, format="json")
    assert [h["text"] for h in everything.json()["results"]] == ["Refunds take five days."]


def test_search_errors_name_what_is_at_fault(alice_client, bob, kb):
    wrong = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/search",
                              {"vector": [0.1] * 10}, format="json")  # fmt: skip
    assert wrong.status_code == 400, wrong.content
    error = wrong.json()["error"]
    assert error["message"].startswith("vector: has 10 dimensions")
    assert error["details"] == {"vector": [error["message"].removeprefix("vector: ")]}
    bobs = knowledge_base_create(owner=bob, name="bob's")
    unknown = "00000000-0000-0000-0000-000000000000"
    for named in ([unknown], [str(kb.pk), str(bobs.pk)]):
        missing = alice_client.post("/api/v1/search", {"query": "x", "knowledge_base_ids": named},
                                    format="json")  # fmt: skip
        assert missing.status_code == 404, missing.content
        error = missing.json()["error"]
        assert error["code"] == "not_found"
        assert error["details"] == {"knowledge_base_ids": [named[-1]]}
        assert named[-1] in error["message"]
