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
