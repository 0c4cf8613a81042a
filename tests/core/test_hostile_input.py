"""Input that used to end in a 500 (or a 502): each answers a 4xx in the JSON error shape
of its path and writes nothing (every table of the project's apps keeps its row count)."""

from __future__ import annotations

import json

import pytest
from django.apps import apps

from knowledge.services import knowledge_base_create
from memories.facts.scopes import end_user_ensure
from tests.memories.facts.seed import seed

pytestmark = pytest.mark.django_db

PROJECT_APPS = {
    "core",
    "knowledge",
    "conversations",
    "memory_bases",
    "memories",
    "stores",
    "ingestion",
}


def row_counts() -> dict[str, int]:
    return {
        model._meta.label: model.objects.count()
        for model in apps.get_models()
        if model._meta.app_label in PROJECT_APPS and not model._meta.proxy
    }


def assert_error(response, status: int, code: str | None = "invalid") -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) >= {"code", "message", "details"}
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


@pytest.fixture
def kb(alice):
    return knowledge_base_create(owner=alice, name="docs")


@pytest.fixture
def existing_memory(alice):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    (fact,) = seed(end_user, "likes tea", reason="test")
    return fact


NUL = "a\u0000b"
SURROGATE = "a\ud800b"


def _cases(flow_id: str, kb_id: str, bad: str) -> list[tuple[str, str, object]]:
    return [
        (
            "POST",
            f"/api/v1/flows/{flow_id}/runs",
            {"session_id": "s1", "messages": [{"role": "user", "content": bad}]},
        ),
        (
            "POST",
            f"/api/v1/flows/{flow_id}/runs",
            {
                "session_id": "s1",
                "messages": [{"role": "user", "content": [{"type": "text", "text": bad}]}],
            },
        ),
        (
            "POST",
            "/api/v1/messages",
            {"flow": flow_id, "session_id": "s1", "role": "user", "content": bad},
        ),
        (
            "POST",
            f"/api/v1/knowledge-bases/{kb_id}/documents",
            {"documents": [{"text": "hello", "metadata": {bad: "v"}}]},
        ),
        (
            "POST",
            f"/api/v1/knowledge-bases/{kb_id}/documents",
            {"documents": [{"text": "hello", "metadata": {"k": bad}}]},
        ),
        (
            "POST",
            f"/api/v1/knowledge-bases/{kb_id}/documents",
            {"documents": [{"text": bad}]},
        ),
        (
            "POST",
            "/api/v1/users/u1/memories",
            {"content": "likes coffee", "infer": False, "metadata": {"k": bad}},
        ),
        (
            "POST",
            f"/api/v1/knowledge-bases/{kb_id}/search",
            {"query": "tea", "filters": {"session_id": bad}},
        ),
        ("POST", "/api/v1/search", {"query": bad}),
        ("POST", "/api/v1/flows", {"name": bad}),
        ("POST", "/api/v1/engine/facts", {"scope": ["user", "u1"], "content": bad}),
        ("POST", "/api/v1/engine/search", {"scope": ["user", bad], "query": "tea"}),
        ("POST", "/api/v1/engine/flush", {"scope": ["user", "u1"], "messages": [{"c": bad}]}),
        ("PATCH", f"/api/v1/knowledge-bases/{kb_id}", {"description": bad}),
    ]


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "lone-surrogate"])
def test_unstorable_text_in_json_is_400_and_writes_nothing(
    alice_client, flow, kb, existing_memory, bad
):
    for method, path, body in _cases(str(flow.pk), str(kb.pk), bad):
        before = row_counts()
        response = alice_client.generic(
            method, path, json.dumps(body), content_type="application/json"
        )
        error = assert_error(response, 400)
        assert "not allowed in text" in error["message"], (path, error)
        assert row_counts() == before, path


def test_the_error_names_the_field(alice_client, flow):
    body = {"session_id": "s1", "messages": [{"role": "user", "content": NUL}]}
    response = alice_client.post(f"/api/v1/flows/{flow.pk}/runs", body, format="json")
    error = assert_error(response, 400)
    assert error["message"] == (
        "messages[0].content: NUL characters (\\u0000) are not allowed in text."
    )
    assert error["details"] == {
        "messages[0].content": ["NUL characters (\\u0000) are not allowed in text."]
    }


@pytest.mark.parametrize("query", ["session_id=a%00b", "flow=%00", "x=%ED%A0%80%00"])
def test_nul_in_query_parameters_is_400(alice_client, query):
    response = alice_client.get(f"/api/v1/messages?{query}")
    error = assert_error(response, 400)
    assert "NUL" in error["message"]


def test_nul_in_the_path_is_400(alice_client):
    assert_error(alice_client.get("/api/v1/users/u%001/memories"), 400)


def test_form_bodies_get_the_same_check(alice_client):
    before = row_counts()
    response = alice_client.post("/api/v1/flows", {"name": NUL})  # multipart
    assert_error(response, 400)
    response = alice_client.post(
        "/api/v1/flows", "name=a%00b", content_type="application/x-www-form-urlencoded"
    )
    assert_error(response, 400)
    assert row_counts() == before


def test_chat_proxy_lone_surrogate_is_a_400_in_openai_shape(
    alice_client, llm_settings, openai_server
):
    before = row_counts()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi \ud83d there"}]})
    response = alice_client.generic(
        "POST", "/v1/chat/completions", body, content_type="application/json"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid"
    assert error["message"].startswith("messages[0].content: Lone UTF-16 surrogates")
    assert openai_server.requests == []  # the upstream was never called
    assert row_counts() == before


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
def test_deeply_nested_json_is_400(alice_client, flow, depth):
    before = row_counts()
    nested = "[" * depth + "]" * depth
    body = '{"session_id": "s1", "messages": [{"role": "user", "content": ' + nested + "}]}"
    response = alice_client.generic(
        "POST", f"/api/v1/flows/{flow.pk}/runs", body, content_type="application/json"
    )
    error = assert_error(response, 400)
    assert "nested at most 64 levels" in error["message"]
    assert row_counts() == before


def test_nesting_within_the_limit_is_accepted(alice_client, kb):
    metadata: dict = {"leaf": 1}
    for _ in range(40):
        metadata = {"n": metadata}
    body = {"documents": [{"text": "nested metadata", "metadata": metadata}]}
    response = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents", body, format="json")
    assert response.status_code == 201, response.content


def test_deep_yaml_config_is_400(alice_client):
    body = "stores:\n  x: " + "[" * 2000 + "]" * 2000
    response = alice_client.generic(
        "POST", "/api/v1/memory-config", body, content_type="application/yaml"
    )
    assert_error(response, 400)


@pytest.mark.parametrize(
    ("vector", "message"),
    [
        ([0.0] * 384, "all zeros"),
        ([1e39] + [0.1] * 383, "finite"),
        ([-1e39] + [0.1] * 383, "finite"),
    ],
)
def test_unusable_query_vectors_are_400(alice_client, kb, vector, message):
    before = row_counts()
    for path in (f"/api/v1/knowledge-bases/{kb.pk}/search", "/api/v1/search"):
        body = {"vector": vector, "mode": "vector"}
        error = assert_error(alice_client.post(path, body, format="json"), 400)
        assert message in error["message"]
        assert error["message"].startswith("vector: ")
    assert row_counts() == before


def test_large_but_valid_vectors_give_finite_scores(alice_client, kb):
    from knowledge.services import DocumentIn, knowledge_documents_submit

    knowledge_documents_submit(
        knowledge_base=kb,
        documents=[DocumentIn.from_payload(text="tea and biscuits", source_key="d1")],
        background=False,
    )
    for scale in (3e38, 1e-30):
        vector = [scale] * 384
        body = {"vector": vector, "mode": "vector"}
        response = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/search", body, format="json")
        assert response.status_code == 200, response.content
        (hit,) = response.json()["results"]
        assert -1.0 <= hit["score"] <= 1.0


def test_chunk_size_below_the_default_overlap_is_400(alice_client):
    before = row_counts()
    response = alice_client.post(
        "/api/v1/knowledge-bases", {"name": "small", "chunk_size": 80}, format="json"
    )
    error = assert_error(response, 400)
    assert "chunk_overlap (the default, 100) must be below chunk_size (80)" in error["message"]
    assert row_counts() == before
    response = alice_client.post(
        "/api/v1/knowledge-bases",
        {"name": "small", "chunk_size": 80, "chunk_overlap": 10},
        format="json",
    )
    assert response.status_code == 201
    assert (response.json()["chunk_size"], response.json()["chunk_overlap"]) == (80, 10)


@pytest.mark.parametrize("header", [b"\xa0", b"\x85", b" \xa0 ", b"\t"])
def test_whitespace_only_authorization_is_401(client, alice, header):
    before = row_counts()
    response = client.get("/api/v1/me", HTTP_AUTHORIZATION=header.decode("latin-1"))
    error = assert_error(response, 401, "not_authenticated")
    assert error["message"] == "Malformed Authorization header."
    assert row_counts() == before


def test_deleting_a_memory_base_knowledge_base_is_409(alice_client, memory_base):
    before = row_counts()
    response = alice_client.delete(f"/api/v1/knowledge-bases/{memory_base.knowledge_base_id}")
    error = assert_error(response, 409, "in_use")
    assert "delete that instead" in error["message"]
    assert "memory base" in error["message"]
    assert row_counts() == before


# --- item 6: error shapes outside DRF, strict booleans ----------------------------------
def test_too_many_query_parameters_is_json_400(alice_client):
    query = "&".join(f"p{i}=1" for i in range(1001))
    error = assert_error(alice_client.get(f"/api/v1/flows?{query}"), 400, "too_many_fields")
    assert error["details"] == {"limit": 1000}
    assert "at most 1000" in error["message"]


def test_too_many_form_fields_is_json_400(alice_client):
    before = row_counts()
    body = "&".join(f"f{i}=1" for i in range(1001))
    response = alice_client.post(
        "/api/v1/flows", body, content_type="application/x-www-form-urlencoded"
    )
    assert_error(response, 400, "too_many_fields")
    assert row_counts() == before


def test_too_many_query_parameters_on_the_chat_proxy_is_openai_shaped(alice_client):
    query = "&".join(f"p{i}=1" for i in range(1001))
    response = alice_client.post(f"/v1/chat/completions?{query}", {}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "too_many_fields")


def test_chat_proxy_500_is_openai_shaped(alice_client, llm_settings, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("unexpected")

    monkeypatch.setattr("memories.proxy.api.views.chat_complete", boom)
    alice_client.raise_request_exception = False
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = alice_client.post("/v1/chat/completions", body, format="json")
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "message": "Internal server error.",
            "type": "api_error",
            "param": None,
            "code": "server_error",
            "details": None,
        }
    }


def test_api_500_keeps_the_project_shape(alice_client, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("unexpected")

    monkeypatch.setattr("core.api.views.MeSerializer", boom)
    alice_client.raise_request_exception = False
    response = alice_client.get("/api/v1/me")
    assert response.status_code == 500
    assert response.json() == {
        "error": {"code": "server_error", "message": "Internal server error.", "details": None}
    }


def test_chat_proxy_unknown_path_is_openai_shaped(alice_client):
    response = alice_client.get("/v1/models-that-do-not-exist")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("value", ["false", "true", 0, 1, "yes", [True]])
def test_chat_stream_must_be_a_boolean(alice_client, llm_settings, openai_server, value):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": value}
    response = alice_client.post("/v1/chat/completions", body, format="json")
    assert response.status_code == 400
    assert not response.streaming
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "stream")
    assert error["message"] == "stream: Must be a boolean (true or false)."
    assert openai_server.requests == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/api/v1/knowledge-bases/{kb}/documents",
            {"documents": [{"text": "x"}], "background": "false"},
        ),
        ("/api/v1/search", {"query": "x", "include_memory_bases": "true"}),
        ("/api/v1/users/u1/memories", {"content": "likes tea", "infer": "false"}),
        ("/api/v1/engine/settings", {"dream_schedule": "false"}),
    ],
)
def test_json_booleans_are_booleans(alice_client, kb, path, body):
    before = row_counts()
    method = alice_client.patch if path.endswith("settings") else alice_client.post
    response = method(path.format(kb=kb.pk), body, format="json")
    error = assert_error(response, 400)
    assert "Must be a boolean" in error["message"]
    assert row_counts() == before


def test_query_parameter_booleans_stay_text(alice_client, existing_memory):
    response = alice_client.get("/api/v1/users/u1/memories/search?q=tea&include_globals=false")
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    "raw", [b'{"k": 1e999}', b'{"k": -1e999}', b'{"k": [1, 2, 1e400]}'], ids=["inf", "-inf", "list"]
)
def test_numbers_too_large_for_a_float_are_400(alice_client, kb, raw):
    before = row_counts()
    body = b'{"documents": [{"text": "x", "metadata": ' + raw + b"}]}"
    response = alice_client.generic(
        "POST", f"/api/v1/knowledge-bases/{kb.pk}/documents", body, content_type="application/json"
    )
    error = assert_error(response, 400)
    assert "Numbers must be finite" in error["message"]
    assert row_counts() == before
