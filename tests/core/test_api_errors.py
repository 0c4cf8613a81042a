from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_unknown_api_path_is_json_404(alice_client):
    response = alice_client.get("/api/v1/does-not-exist")
    assert response.status_code == 404
    assert response.json() == {
        "error": {"code": "not_found", "message": "Not found.", "details": None}
    }


def test_validation_error_shape(alice_client):
    response = alice_client.post("/api/v1/api-keys", {"name": "x" * 101}, format="json")
    assert response.status_code == 400
    body = response.json()["error"]
    assert body["code"] == "invalid"
    assert "name" in body["details"]


def test_malformed_json_is_400(alice_client):
    response = alice_client.generic(
        "POST", "/api/v1/api-keys", "{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"


def test_oversized_body_is_413_and_writes_nothing(alice_client, settings):
    from core.models import APIKey

    settings.MAX_REQUEST_BYTES = 2048
    before = APIKey.objects.count()
    response = alice_client.post("/api/v1/api-keys", {"name": "x" * 5000}, format="json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert response.json()["error"]["details"]["limit"] == 2048
    assert APIKey.objects.count() == before


def test_method_not_allowed_shape(alice_client):
    response = alice_client.put("/api/v1/me", {}, format="json")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_list_endpoints_are_paginated(alice_client, alice):
    from core.services import api_key_create

    for i in range(3):
        api_key_create(owner=alice, name=f"k{i}")
    body = alice_client.get("/api/v1/api-keys?page_size=2").json()
    assert body["count"] == 4
    assert len(body["results"]) == 2
    assert body["next"] is not None


def test_schema_and_docs_are_served_without_a_cdn(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/api-keys" in schema.content
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html
    assert "cdn" not in html.lower()
    assert "/static/drf_spectacular_sidecar/" in html


def test_admin_html_404_stays_html(admin_client):
    response = admin_client.get("/not-an-api-path")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    "query", ["page_size=0", "page_size=abc", "page_size=501", "page=0", "page=abc", "page=-1"]
)
def test_malformed_pagination_is_400(alice_client, query):
    response = alice_client.get(f"/api/v1/api-keys?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["message"].endswith(
        "Must be a whole number from 1" + (" up to 500." if "size" in query else ".")
    )


def test_a_page_past_the_last_is_404(alice_client):
    assert alice_client.get("/api/v1/api-keys?page=99").status_code == 404
    assert alice_client.get("/api/v1/api-keys?page=1&page_size=500").status_code == 200
