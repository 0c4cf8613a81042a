"""While the database is unreachable every endpoint answers 503 ``database_unavailable``
(the JSON shape, OpenAI's under /v1/) with Retry-After, never a 500.

The outage is real: the request runs in a thread whose connection points at a port
where no server listens, so psycopg fails to connect as it does when the server is
down. (The kill -9 of a real server under load is in test_self_healing.py.)
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import OperationalError, connections, transaction
from django.test import Client

from core.db_recovery import is_database_unavailable

pytestmark = pytest.mark.django_db


def _during_outage(path: str, method: str = "get", **kwargs):
    result = {}

    def run() -> None:
        conn = connections["default"]
        conn.close()
        conn.settings_dict = {**conn.settings_dict, "HOST": "127.0.0.1", "PORT": "9"}
        try:
            result["response"] = getattr(Client(raise_request_exception=False), method)(
                path, **kwargs
            )
        finally:
            conn.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return result["response"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/api/v1/me", None),
        ("get", "/api/v1/flows", None),
        ("post", "/api/v1/messages", {"flow": "x", "session_id": "s", "content": "hi"}),
    ],
)
def test_api_answers_503_json_with_retry_after(method, path, body):
    kwargs = {"HTTP_AUTHORIZATION": "Bearer mem_whatever"}
    if body is not None:
        kwargs.update(data=body, content_type="application/json")
    response = _during_outage(path, method, **kwargs)
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert response.json() == {
        "error": {
            "code": "database_unavailable",
            "message": "The database is unavailable; retry shortly.",
            "details": None,
        }
    }


def test_admin_answers_503_instead_of_a_500_page():
    response = _during_outage("/admin/login/", "post", data={"username": "a", "password": "b"})
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert response.json()["error"]["code"] == "database_unavailable"


def test_openai_endpoint_answers_in_openai_shape():
    response = _during_outage(
        "/v1/chat/completions",
        "post",
        data={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        content_type="application/json",
        HTTP_AUTHORIZATION="Bearer mem_whatever",
    )
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    error = response.json()["error"]
    assert error["code"] == "database_unavailable"
    assert error["type"] == "api_error"
    assert error["message"] == "The database is unavailable; retry shortly."


def test_healthz_says_database_unavailable():
    response = _during_outage("/healthz")
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    body = response.json()
    assert body["status"] == "error"
    assert body["database"]["status"] == "unavailable"
    assert body["error"]["code"] == "database_unavailable"


def test_query_errors_are_not_outages():
    """A cancelled statement is an OperationalError too, with SQLSTATE 57014: no outage."""
    with pytest.raises(OperationalError) as raised, transaction.atomic():
        with connections["default"].cursor() as cur:
            cur.execute("SET LOCAL statement_timeout = 1")
            cur.execute("SELECT pg_sleep(1)")
    assert raised.value.__cause__.sqlstate == "57014"
    assert not is_database_unavailable(raised.value)


def test_outage_classification():
    refused = psycopg.OperationalError("connection failed: Connection refused")
    assert is_database_unavailable(refused)
    wrapped = OperationalError("x")
    wrapped.__cause__ = refused
    assert is_database_unavailable(wrapped)
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected")
    assert not is_database_unavailable(deadlock)
    shutting_down = psycopg.errors.AdminShutdown("terminating connection")
    assert is_database_unavailable(shutting_down)
