"""A text field takes a JSON string and nothing else: a number where the schema says
string is a 400 in the error shape, and nothing is written (schemathesis's "invalid data
rejected" check found ``POST /api-keys {"name": -2071580397144}`` accepted)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.models import APIKey

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


def test_no_api_serializer_uses_drfs_lenient_char_field():
    """Every text field of the API is ``core.api.fields.StrictCharField``."""
    lenient = re.compile(r"\bserializers\.CharField\(")
    found = [
        str(path.relative_to(ROOT))
        for app in ("core", "memories", "knowledge", "ingestion")
        for path in (ROOT / app).rglob("*.py")
        if lenient.search(path.read_text())
    ]
    assert found == []


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
