"""Every error path answers a plain sentence: no ``ErrorDetail(string=...)`` or other
Python reprs in any error message, and a 400 names the field at fault."""

from __future__ import annotations

import json
import re

import pytest

from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db
REPR = re.compile(r"ErrorDetail|[\[{(]'|'[\]})]|<[A-Za-z_.]+ object")


def _cases(flow, memory_base, kb) -> list[tuple[str, str, dict, str]]:
    """(method, path, body or query, the field the message must name first)."""
    kbp = f"/api/v1/knowledge-bases/{kb.pk}"
    conv = "/api/v1/conversations/s1"
    return [
        ("post", "/api/v1/api-keys", {"name": "x" * 101}, "name"),
        ("post", "/api/v1/knowledge-bases", {}, "name"),
        ("post", "/api/v1/knowledge-bases", {"name": "a", "chunk_size": 10}, "chunk_size"),
        ("patch", kbp, {"chunk_size": 5}, "chunk_size"),
        ("post", f"{kbp}/documents", {"documents": [{"text": " "}]}, "documents[0].text"),
        ("post", f"{kbp}/documents", {"documents": "x"}, "documents"),
        ("post", f"{kbp}/search", {"query": "a", "top_k": 0}, "top_k"),
        ("post", "/api/v1/search", {"query": "a", "mode": "psychic"}, "mode"),
        ("post", "/api/v1/flows", {"name": " "}, "name"),
        (
            "post",
            f"/api/v1/flows/{flow.pk}/runs",
            {"session_id": "s1", "messages": [{"role": "user", "content": "x"}, {"role": "w"}]},
            "messages[1].role",
        ),
        ("post", "/api/v1/messages", {"flow": str(flow.pk), "session_id": "s1"}, "role"),
        ("get", f"{conv}/history", {"flow": "nope"}, "flow"),
        ("get", f"{conv}/history", {"flow": str(flow.pk), "max_tokens": 0}, "max_tokens"),
        ("post", f"{conv}/nodes/llm/turns", {"flow": str(flow.pk)}, "message_id"),
        (
            "post",
            "/api/v1/memory-bases",
            {"name": "m", "flow": str(flow.pk), "threshold": 0},
            "threshold",
        ),
        (
            "post",
            f"/api/v1/memory-bases/{memory_base.pk}/flush",
            {"session_id": "bad id"},
            "session_id",
        ),
        ("post", "/api/v1/users/u1/memories", {"content": " "}, "content"),
        (
            "post",
            "/api/v1/users/u1/memories",
            {"messages": [{"role": "x", "content": "a"}]},
            "messages[0].role",
        ),
        ("get", "/api/v1/users/u1/memories/search", {}, "query"),
        ("post", "/api/v1/users/u1/memories/search", {}, "query"),
        ("post", "/api/v1/global-memories", {}, "content"),
        (
            "post",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}, {"role": "user"}]},
            "messages[1].content",
        ),
    ]


def test_every_bad_request_answers_a_plain_sentence_naming_the_field(
    alice, alice_client, flow, memory_base
):
    kb = make_kb(alice)
    for method, path, body, field in _cases(flow, memory_base, kb):
        if method == "get":
            response = alice_client.get(path, body)
        else:
            response = getattr(alice_client, method)(path, body, format="json")
        assert response.status_code == 400, (path, response.json())
        error = response.json()["error"]
        message = error["message"]
        assert isinstance(message, str) and not REPR.search(message), (path, message)
        assert message.startswith(f"{field}: "), (path, message)
        assert "ErrorDetail" not in json.dumps(response.json()), path


def test_service_errors_are_plain_sentences_too(alice_client, flow):
    """409/422 answers from services, on the paths issue 16 touched."""
    body = {"flow": str(flow.pk), "session_id": "s1", "role": "user", "content": "hi"}
    alice_client.post("/api/v1/messages", {**body, "message_id": "m1"}, format="json")
    answers = [
        alice_client.post("/api/v1/messages", {**body, "message_id": "m1"}, format="json"),
        alice_client.post("/api/v1/messages", {**body, "parent_message_id": "x"}, format="json"),
        alice_client.get(
            "/api/v1/conversations/s1/history", {"flow": str(flow.pk), "current_message_id": "x"}
        ),
    ]
    assert [a.status_code for a in answers] == [409, 422, 422]
    for answer in answers:
        message = answer.json()["error"]["message"]
        assert message[0].isupper() and message.endswith("."), message
        assert "ErrorDetail" not in message and "['" not in message, message
