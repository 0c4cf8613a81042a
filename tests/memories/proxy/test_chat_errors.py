"""Bad input to /v1/chat/completions: OpenAI-style errors, nothing written."""

from __future__ import annotations

import pytest

from memories.facts.models import Fact, Scope

pytestmark = pytest.mark.django_db


@pytest.fixture
def configured(llm_settings, openai_server, fixture_embedder):
    return openai_server


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"model": "m"}, "messages", "messages: This field is required."),
        ({"model": "m", "messages": []}, "messages", "messages: This list may not be empty."),
        (
            {"model": "m", "messages": "hello"},
            "messages",
            'messages: Expected a list of items but got type "str".',
        ),
        (
            {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
            "messages",
            'messages[0].role: "wizard" is not a valid choice.',
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "user"}]},
            "messages",
            "messages[1].content: Required for this role.",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": 42}]},
            "messages",
            "messages[0].content: Must be a string or a list of content parts.",
        ),
        (
            {"model": 7, "messages": [{"role": "user", "content": "x"}]},
            "model",
            "model: Must be a string.",
        ),
    ],
)
def test_malformed_requests(alice_client, configured, body, param, message):
    response = alice_client.post(
        "/v1/chat/completions", body, format="json", HTTP_X_OPENWEBUI_USER_ID="u1"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid",
        param,
    )
    assert error["message"] == message  # a plain sentence naming the field, no reprs
    assert configured.requests == []
    assert not Scope.objects.exists()


def test_invalid_user_id(alice_client, configured):
    response = alice_client.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}]},
        format="json",
        HTTP_X_OPENWEBUI_USER_ID="bad user id!",
    )
    assert response.status_code == 400
    error = response.json()["error"]
    # named by the header it came in (it was named "user", a field the body never had)
    assert (error["code"], error["param"]) == ("invalid_user", "X-OpenWebUI-User-Id")
    assert error["message"].startswith("X-OpenWebUI-User-Id: must be 1-255 characters")
    assert not Scope.objects.exists() and configured.requests == []


@pytest.mark.parametrize("user", ["bad user id!", "u" * 256])
def test_an_end_user_id_in_the_body_is_refused_as_the_headers(alice_client, configured, user):
    """A body's ``user`` over 255 characters was a 400 ``invalid`` (its length checked
    first), where the same id in the header is ``invalid_user``, as the docs say."""
    response = alice_client.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "user": user},
        format="json",
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_user", "user")
    assert not Scope.objects.exists() and configured.requests == []


def test_oversized_body_is_413_openai_style(alice_client, configured, settings):
    settings.MAX_REQUEST_BYTES = 2048
    response = alice_client.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x" * 5000}]},
        format="json",
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert configured.requests == []


def test_no_llm_configured_is_503_naming_the_variable(alice_client, settings):
    settings.LLM_BASE_URL = ""
    response = alice_client.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}]},
        format="json",
        HTTP_X_OPENWEBUI_USER_ID="u1",
    )
    assert response.status_code == 503
    error = response.json()["error"]
    assert (error["code"], error["details"]) == ("not_configured", {"variable": "LLM_BASE_URL"})
    assert not Scope.objects.exists() and not Fact.objects.exists()


def test_unauthenticated_is_401_openai_style(anon_client, configured):
    response = anon_client.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, format="json"
    )
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert configured.requests == []
