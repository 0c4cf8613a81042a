"""Safe defaults: /metrics closed, /healthz terse for strangers, the admin login slows
repeated failures, API keys are rate limited (429 with Retry-After)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.signals import user_login_failed
from django.core.cache import cache, caches

from memories.conversations.models import Flow
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _clear() -> None:
    for alias in caches.settings:  # the throttle's cache, and the login counters'
        caches[alias].clear()


@pytest.fixture(autouse=True)
def _fresh_counters():
    _clear()
    yield
    _clear()


# --- /metrics --------------------------------------------------------------------------
def test_metrics_closed_without_a_token(client, alice_client, settings):
    settings.METRICS_TOKEN = ""
    for caller in (client, alice_client):
        response = caller.get("/metrics")
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "not_authenticated"
        assert "METRICS_TOKEN is not set" in error["message"]
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer ")
    assert response.status_code == 401


def test_metrics_with_the_token_compared_in_constant_time(client, settings, monkeypatch):
    import hmac

    settings.METRICS_TOKEN = "s3cret"
    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cre").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret!").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert response.status_code == 200
    assert b"memory_total_count" in response.content
    assert compared[-1] == (b"Bearer s3cret", b"Bearer s3cret")


def test_metrics_for_a_staff_session(admin_client, settings):
    settings.METRICS_TOKEN = ""
    assert admin_client.get("/metrics").status_code == 200


# --- /healthz --------------------------------------------------------------------------
def test_healthz_for_strangers_gives_statuses_only(client, settings, tmp_path):
    settings.WORKER_STATE_DIR = tmp_path  # no worker on this host
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"status", "time", "database", "pgvector", "worker"}
    assert body["database"] == {"status": "ok"}
    assert body["pgvector"] == {"status": "ok"}
    assert body["worker"] == {"status": "down", "host": {"status": "none"}}
    assert "PostgreSQL" not in json.dumps(body)
    assert "version" not in json.dumps(body)


def test_healthz_with_a_key_gives_the_full_report(alice_client, admin_client):
    for caller in (alice_client, admin_client):
        body = caller.get("/healthz").json()
        assert body["database"]["version"].startswith("PostgreSQL")
        assert body["pgvector"]["version"]
        assert "queue" in body["worker"]


def test_healthz_with_a_wrong_key_is_terse(client):
    body = client.get("/healthz", HTTP_AUTHORIZATION="Bearer nope").json()
    assert body["database"] == {"status": "ok"}


# --- the admin login -------------------------------------------------------------------
def _login(client, username: str, password: str):
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password},
        REMOTE_ADDR="203.0.113.9",
    )


def test_thirty_wrong_passwords_are_not_all_tried(client, settings):
    UserFactory(username="root", is_staff=True, is_superuser=True, password="right-password")
    UserFactory(username="other", is_staff=True, password="other-password")
    tried = []

    def count(sender, credentials, **kwargs):
        tried.append(credentials["username"])

    user_login_failed.connect(count)
    try:
        answers = [_login(client, "root", f"wrong-{i}") for i in range(30)]
    finally:
        user_login_failed.disconnect(count)
    assert len(tried) == settings.ADMIN_LOGIN_MAX_FAILURES == 5
    assert all(a.status_code == 200 for a in answers)  # the form again, with an error
    assert "Too many failed login attempts" in answers[-1].content.decode()
    assert "Too many failed login attempts" not in answers[4].content.decode()
    # Locked: even the right password is refused, unchecked.
    refused = _login(client, "root", "right-password")
    assert refused.status_code == 200
    assert "_auth_user_id" not in client.session
    # Another account from the same address still logs in.
    assert _login(client, "other", "other-password").status_code == 302
    client.logout()
    cache.clear()  # the lockout window has passed
    assert _login(client, "root", "right-password").status_code == 302


def test_a_success_resets_the_count(client):
    UserFactory(username="root", is_staff=True, password="right-password")
    for i in range(4):
        _login(client, "root", f"wrong-{i}")
    assert _login(client, "root", "right-password").status_code == 302
    client.logout()
    for i in range(4):
        _login(client, "root", f"wrong-again-{i}")
    assert _login(client, "root", "right-password").status_code == 302


def test_one_address_trying_many_usernames_is_locked(client, settings):
    UserFactory(username="root", is_staff=True, password="right-password")
    for i in range(settings.ADMIN_LOGIN_MAX_FAILURES * 4):
        _login(client, f"user{i}", "guess")
    assert _login(client, "root", "right-password").status_code == 200  # the address is locked


# --- API throttling --------------------------------------------------------------------
def test_api_keys_are_rate_limited(alice_client, bob_client, settings):
    settings.API_THROTTLE_RATE = "3/minute"
    for i in range(3):
        assert (
            alice_client.post("/api/v1/flows", {"name": f"f{i}"}, format="json").status_code == 201
        )
    response = alice_client.post("/api/v1/flows", {"name": "over"}, format="json")
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "throttled"
    assert error["message"].startswith("Request was throttled.")
    assert 1 <= int(response["Retry-After"]) <= 60
    assert Flow.objects.filter(name="over").count() == 0  # nothing written
    assert alice_client.get("/api/v1/me").status_code == 429
    assert bob_client.get("/api/v1/me").status_code == 200  # per key


def test_session_users_are_not_limited(admin_client, settings):
    settings.API_THROTTLE_RATE = "1/minute"
    for _ in range(3):
        assert admin_client.get("/api/v1/me").status_code == 200


def test_empty_rate_means_no_limit(alice_client, settings):
    settings.API_THROTTLE_RATE = ""
    for _ in range(5):
        assert alice_client.get("/api/v1/me").status_code == 200


def test_chat_proxy_rate_is_its_own_in_openai_shape(alice_client, settings):
    settings.CHAT_THROTTLE_RATE = "1/minute"
    settings.LLM_BASE_URL = ""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    first = alice_client.post("/v1/chat/completions", body, format="json")
    assert first.status_code == 503  # no LLM configured: counted all the same
    response = alice_client.post("/v1/chat/completions", body, format="json")
    assert response.status_code == 429
    assert response["Retry-After"]
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "throttled")
    assert alice_client.get("/api/v1/me").status_code == 200  # the API's own budget
