"""Ids may contain ``/`` (``tenant/42``): every path that takes a session id or an end-user
id accepts them, written plainly or as ``%2F``, so what ``/runs`` or the chat proxy
accepted can be read and deleted."""

from __future__ import annotations

import pytest

from memories.bases.services import messages_record
from memories.conversations.models import Message
from memories.conversations.services import MessageIn
from memories.facts.models import Scope

pytestmark = pytest.mark.django_db

SESSION = "tenant/42/chat"


@pytest.fixture
def captured(alice_client, flow):
    body = {
        "session_id": SESSION,
        "messages": [
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "general kenobi"},
        ],
    }
    response = alice_client.post(f"/api/v1/flows/{flow.pk}/runs", body, format="json")
    assert response.status_code == 201
    return flow


@pytest.mark.parametrize("written", [SESSION, SESSION.replace("/", "%2F")])
def test_conversation_history(alice_client, captured, written):
    response = alice_client.get(f"/api/v1/conversations/{written}/history?flow={captured.pk}")
    assert response.status_code == 200
    assert [m["content"] for m in response.json()["messages"]] == [
        "hello there",
        "general kenobi",
    ]


def test_messages_listed_by_session(alice_client, captured):
    response = alice_client.get(f"/api/v1/messages?session_id={SESSION}")
    assert response.json()["count"] == 2


@pytest.mark.parametrize("written", [SESSION, SESSION.replace("/", "%2F")])
def test_session_messages_delete(alice_client, captured, written):
    response = alice_client.delete(f"/api/v1/flows/{captured.pk}/sessions/{written}/messages")
    assert response.status_code == 200
    assert response.json() == {"deleted": 2}
    assert not Message.objects.filter(session_id=SESSION).exists()


def test_session_delete_leaves_other_sessions(alice_client, captured):
    messages_record(
        flow=captured,
        session_id="tenant",
        run_id="r",
        messages=[MessageIn(role="user", text="other")],
    )
    alice_client.delete(f"/api/v1/flows/{captured.pk}/sessions/{SESSION}/messages")
    assert list(Message.objects.values_list("session_id", flat=True)) == ["tenant"]


@pytest.mark.parametrize("written", [SESSION, SESSION.replace("/", "%2F")])
def test_node_memory_paths(alice_client, flow, written):
    base = f"/api/v1/conversations/{written}/nodes/n1"
    turn = {
        "flow": str(flow.pk),
        "message_id": "m1",
        "user_content": "hi",
        "assistant_content": "hello",
    }
    assert alice_client.post(f"{base}/turns", turn, format="json").status_code == 201
    history = alice_client.get(f"{base}/history?flow={flow.pk}")
    assert history.status_code == 200
    assert [m["content"] for m in history.json()["messages"]] == ["hi", "hello"]
    assert alice_client.delete(f"{base}?flow={flow.pk}").status_code == 204
    history = alice_client.get(f"/api/v1/conversations/{SESSION}/nodes/n1/history?flow={flow.pk}")
    assert history.status_code == 404  # the node's memory is gone


def test_memory_base_flush_of_a_session(alice_client, captured, memory_base):
    response = alice_client.post(
        f"/api/v1/memory-bases/{memory_base.pk}/flush", {"session_id": SESSION}, format="json"
    )
    assert response.status_code == 202
    (job,) = response.json()["jobs"]
    assert job["session_id"] == SESSION
    sessions = alice_client.get(f"/api/v1/memory-bases/{memory_base.pk}/sessions").json()
    assert [s["session_id"] for s in sessions["results"]] == [SESSION]


USER = "org/7/alice"


@pytest.mark.parametrize("written", [USER, USER.replace("/", "%2F")])
def test_end_user_paths(alice_client, written):
    base = f"/api/v1/users/{written}/memories"
    created = alice_client.post(base, {"content": "likes green tea", "infer": False}, format="json")
    assert created.status_code == 201, created.content
    (memory,) = created.json()["memories"]
    assert Scope.objects.get().external_id == USER
    assert alice_client.get(base).json()["count"] == 1
    search = alice_client.get(f"{base}/search?q=green tea")
    assert [hit["id"] for hit in search.json()["results"]] == [memory["id"]]
    assert alice_client.get(f"{base}/{memory['id']}").json()["content"] == "likes green tea"
    assert alice_client.get(f"{base}/{memory['id']}/history").status_code == 200
    patched = alice_client.patch(
        f"{base}/{memory['id']}", {"content": "likes oolong"}, format="json"
    )
    assert patched.status_code == 200
    assert alice_client.delete(f"{base}/{patched.json()['id']}").status_code == 204
    assert alice_client.delete(base).status_code == 200
    assert not Scope.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/conversations/bad id/history?flow={flow}",
        "/api/v1/conversations/-starts-with-dash/history?flow={flow}",
    ],
)
def test_session_ids_that_cannot_exist_are_404(alice_client, flow, path):
    response = alice_client.get(path.format(flow=flow.pk))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("user", ["bad id", "-dash", "a" * 300])
def test_malformed_end_user_ids_are_400(alice_client, user):
    for path in (f"/api/v1/users/{user}/memories", f"/api/v1/users/{user}/memories/search?q=x"):
        response = alice_client.get(path)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_user"
