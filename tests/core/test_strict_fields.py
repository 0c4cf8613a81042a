"""A text field takes a JSON string and nothing else: a number where the schema says
string is a 400 in the error shape, and nothing is written (schemathesis's "invalid data
rejected" check found ``POST /api-keys {"name": -2071580397144}`` accepted)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.models import APIKey
from memories.stores.models import MemoryStore

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", [-2071580397144, 1.5, True, ["deploy"], {"a": "b"}])
def test_a_number_for_a_name_is_refused_and_no_key_is_made(alice, alice_client, name):
    before = list(APIKey.objects.values_list("pk", "name"))
    response = alice_client.post("/api/v1/api-keys", {"name": name}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["details"] == {"name": ["Must be a string."]}
    assert list(APIKey.objects.values_list("pk", "name")) == before


def test_a_number_for_a_search_query_is_refused(alice_client, memory_base):
    kb = memory_base.knowledge_base_id
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb}/search", {"query": 12345}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"]["query"] == ["Must be a string."]


def _sources_using(pattern: str) -> list[str]:
    lenient = re.compile(pattern)
    return [
        str(path.relative_to(ROOT))
        for app in ("core", "memories", "knowledge", "ingestion")
        for path in (ROOT / app).rglob("*.py")
        if lenient.search(path.read_text())
    ]


def test_no_api_serializer_uses_drfs_lenient_char_field():
    """Every text field of the API is ``core.api.fields.StrictCharField``."""
    assert _sources_using(r"\bserializers\.CharField\(") == []


def test_a_400s_details_list_each_fields_messages_whatever_found_them(alice_client):
    """One shape per field (issue 26): the request's validation (DRF) and a service
    (here the fact write service, refusing a validity that ends before it starts) both
    answer a field's messages as a list."""
    by_validation = alice_client.post("/api/v1/knowledge-bases", {"name": 123}, format="json")
    by_service = alice_client.post("/api/v1/engine/facts", {"scope": ["user", "u1"],
                                   "content": "User lived in Rome", "valid_from": "2020-01-01",
                                   "valid_to": "2019-01-01"}, format="json")  # fmt: skip
    assert by_validation.status_code == by_service.status_code == 400
    assert by_validation.json()["error"]["details"] == {"name": ["Must be a string."]}
    assert by_service.json()["error"]["details"] == {"valid_to": ["not after valid_from"]}


def test_no_api_serializer_uses_drfs_lenient_number_fields():
    """Every number a body takes is ``StrictIntegerField`` or ``StrictFloatField``: DRF's
    own read ``true`` as 1 and ``"3"`` as 3 (an audit found ``{"confidence": true}``
    stored as 1.0 and a store's ``"max_items": "5"`` taken)."""
    assert _sources_using(r"\bserializers\.(IntegerField|FloatField)\(") == []


def _search(client, kb, **fields):
    return client.post(f"/api/v1/knowledge-bases/{kb}/search", {"query": "x", **fields},
                       format="json")  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "details"),
    [
        ({"top_k": "3"}, {"top_k": ["Must be a whole number."]}),
        ({"top_k": True}, {"top_k": ["Must be a whole number."]}),
        ({"half_life_days": True}, {"half_life_days": ["Must be a number."]}),
        ({"similarity_threshold": "0.5"}, {"similarity_threshold": ["Must be a number."]}),
        ({"vector": [True] + [0.1] * 383}, {"vector": {"0": ["Must be a number."]}}),
    ],
)
def test_a_number_in_text_or_a_boolean_is_refused_by_a_search(
    alice_client, memory_base, fields, details
):
    response = _search(alice_client, memory_base.knowledge_base_id, **fields)
    assert response.status_code == 400
    assert response.json()["error"]["details"] == details


def test_a_stores_number_in_text_is_refused_and_no_store_is_made(alice, alice_client):
    response = alice_client.post("/api/v1/memory-stores", {"name": "t3", "type": "blackboard",
                                 "config": {"max_items": "5"}}, format="json")  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {"config.max_items": ["Must be a whole number."]}
    assert not MemoryStore.objects.filter(owner=alice).exists()


def test_an_attachments_number_in_text_is_refused_and_nothing_is_applied(alice, alice_client, flow):
    document = {
        "memory": [{"name": "board", "type": "blackboard"}],
        "nodes": [{"id": "answer", "flow": flow.name, "memories": [{"name": "board", "top_k": "3"}]}],
    }  # fmt: skip
    response = alice_client.post("/api/v1/memory-config", document, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {
        "nodes[0].memories[0].top_k": ["Must be a whole number."]
    }
    assert not MemoryStore.objects.filter(owner=alice).exists()


def test_a_fact_searchs_boolean_confidence_floor_is_refused(alice_client):
    body = {"scope": ["user", "u1"], "query": "x", "filter": {"min_confidence": True}}
    response = alice_client.post("/api/v1/engine/search", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {
        "filter": {"min_confidence": ["Must be a number."]}
    }


def test_query_parameters_stay_text_that_reads_as_a_number(alice_client):
    """A query string has no JSON types: ``limit=5`` and ``half_life_days=30`` are read."""
    made = alice_client.post("/api/v1/engine/facts", {"scope": ["user", "u1"],
                             "content": "User likes tea"}, format="json")  # fmt: skip
    assert made.status_code == 201
    response = alice_client.get(
        "/api/v1/users/u1/memories/search", {"q": "tea", "limit": "5", "half_life_days": "30"}
    )
    assert response.status_code == 200
    assert [hit["content"] for hit in response.json()["results"]] == ["User likes tea"]
    refused = alice_client.get("/api/v1/users/u1/memories/search", {"q": "tea", "limit": "five"})
    assert refused.status_code == 400
    assert refused.json()["error"]["details"] == {"limit": ["Must be a whole number."]}


def test_a_query_boolean_takes_the_documented_words_and_no_other(alice_client):
    """DRF's own reading took yes/no/on/off too, where ``query_flag`` (``download``,
    ``vectors``) refused them: one set of words, in any case, everywhere."""
    made = alice_client.post("/api/v1/engine/facts", {"scope": ["user", "u1"],
                             "content": "User likes tea"}, format="json")  # fmt: skip
    assert made.status_code == 201
    url = "/api/v1/users/u1/memories/search"
    for word in ("true", "TRUE", "1", "false", "0"):
        assert alice_client.get(url, {"q": "tea", "include_globals": word}).status_code == 200
    refused = alice_client.get(url, {"q": "tea", "include_globals": "yes"})
    assert refused.status_code == 400
    assert refused.json()["error"]["details"] == {
        "include_globals": ["Must be true, false, 1 or 0."]
    }
