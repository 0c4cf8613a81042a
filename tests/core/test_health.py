from __future__ import annotations

import pytest

from core.health import pgvector_supports_iterative_scan

pytestmark = pytest.mark.django_db


def test_healthz_reports_database_and_pgvector(alice_client):
    response = alice_client.get("/healthz")  # the full report needs a key
    assert response.status_code == 200
    body = response.json()
    assert body["database"]["status"] == "ok"
    assert body["database"]["version"].startswith("PostgreSQL")
    assert body["pgvector"] == {"status": "ok", "version": "0.8.2", "iterative_scan": True}
    # No worker runs during the unit tests: reported, not fatal.
    assert body["worker"]["status"] == "down"
    assert body["status"] == "degraded"


def test_healthz_is_public_and_get_only(client):
    assert client.post("/healthz").status_code == 405


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.8.2", True),
        ("0.8.0", True),
        ("0.10.1", True),
        ("0.7.4", False),
        ("0.5.1", False),
        (None, False),
    ],
)
def test_iterative_scan_detection(version, expected):
    assert pgvector_supports_iterative_scan(version) is expected
