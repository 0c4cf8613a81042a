"""A key that names no field of a body is a 400 naming it, and nothing is written: a
typo ("topk", "chunksize", "infr") was dropped, and the request ran with the defaults."""

from __future__ import annotations

import pytest

from knowledge.models import Chunk, KnowledgeBase
from memories.conversations.models import Message
from memories.facts.models import Fact
from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db


def _refused(response, field: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["details"][field] == [f"Unknown field {field.rsplit('.', 1)[-1]}."]


def test_a_knowledge_base_create_with_a_misspelt_field(alice_client):
    response = alice_client.post(
        "/api/v1/knowledge-bases", {"name": "typo", "chunksize": 300}, format="json"
    )
    _refused(response, "chunksize")
    # a files base is made by index_files --create, not here (it was dropped: a base of
    # documents)
    response = alice_client.post(
        "/api/v1/knowledge-bases", {"name": "files", "source_kind": "files"}, format="json"
    )
    _refused(response, "source_kind")
    assert not KnowledgeBase.objects.exists()


def test_documents_and_a_search_with_a_misspelt_field(alice, alice_client):
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}"
    _refused(alice_client.post(f"{url}/documents", {"documents": [{"text": "a"}], "backgrond": True},
                               format="json"), "backgrond")  # fmt: skip
    response = alice_client.post(
        f"{url}/documents", {"documents": [{"text": "a", "metdata": {"x": 1}}]}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "metdata" in str(response.json()["error"]["details"])
    assert not Chunk.objects.exists()
    _refused(alice_client.post(f"{url}/search", {"query": "a", "topk": 1}, format="json"), "topk")
    _refused(
        alice_client.post("/api/v1/search", {"query": "a", "knowledge_base_ids": [str(kb.pk)],
                                             "topk": 1}, format="json"), "topk",
    )  # fmt: skip


def test_a_run_and_a_memory_with_a_misspelt_field(alice_client, flow):
    url = f"/api/v1/flows/{flow.pk}/runs"
    message = {"role": "assistant", "content": "hi"}
    _refused(alice_client.post(url, {"session_id": "s", "messages": [message], "bogus": 1},
                               format="json"), "bogus")  # fmt: skip
    response = alice_client.post(
        url, {"session_id": "s", "messages": [{**message, "sender_nam": "Al"}]}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "sender_nam" in str(response.json()["error"]["details"])
    assert not Message.objects.exists()
    response = alice_client.post(
        "/api/v1/users/ann/memories", {"content": "I like tea", "infr": False}, format="json"
    )
    _refused(response, "infr")
    assert not Fact.objects.exists()


def test_a_key_made_with_a_misspelt_limit_is_refused_not_made_whole(alice_client):
    """``"readonly": true`` made a full key, ``"expires": ...`` one that never expires."""
    from core.models import APIKey

    before = APIKey.objects.count()
    _refused(alice_client.post("/api/v1/api-keys", {"name": "ext", "readonly": True},
                               format="json"), "readonly")  # fmt: skip
    _refused(alice_client.post("/api/v1/api-keys", {"expires": "2999-01-01T00:00:00Z"},
                               format="json"), "expires")  # fmt: skip
    assert APIKey.objects.count() == before
    _refused(alice_client.patch("/api/v1/me", {"background_daily_token": 5}, format="json"),
             "background_daily_token")  # fmt: skip


def test_a_memory_store_with_a_misspelt_field(alice_client):
    from memories.stores.models import MemoryStore

    _refused(alice_client.post("/api/v1/memory-stores", {"name": "s", "type": "simple",
                                                         "confg": {}}, format="json"), "confg")  # fmt: skip
    assert not MemoryStore.objects.exists()


def test_flows_searches_tool_calls_and_node_turns_with_a_misspelt_field(alice_client, flow):
    from memories.conversations.models import Flow

    _refused(alice_client.post("/api/v1/flows", {"name": "f", "nmae": "g"}, format="json"), "nmae")
    assert Flow.objects.count() == 1
    _refused(alice_client.post("/api/v1/users/ann/memories/search", {"query": "tea", "limt": 3},
                               format="json"), "limt")  # fmt: skip
    _refused(alice_client.post("/api/v1/tools/search_memory/call", {
        "scope": ["user", "ann"], "argument": {"query": "tea"}}, format="json"), "argument")  # fmt: skip
    turn = {"flow": str(flow.pk), "message_id": "m1", "user_content": "q",
            "assistant_content": "a", "assitant_files": []}  # fmt: skip
    _refused(alice_client.post("/api/v1/conversations/s1/nodes/n1/turns", turn, format="json"),
             "assitant_files")  # fmt: skip
    assert not Message.objects.exists()


def test_an_agents_openai_messages_go_into_a_run_as_they_are(alice_client, flow):
    """A tool message's ``tool_call_id`` and a message's ``name`` (OpenAI's keys) are
    taken and dropped, as before; only keys no such client sends are refused."""
    messages = [
        {"role": "user", "content": "weather?", "name": "ann"},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    response = alice_client.post(f"/api/v1/flows/{flow.pk}/runs",
                                 {"session_id": "s", "messages": messages}, format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    assert list(Message.objects.order_by("id").values_list("role", "text")) == [
        ("user", "weather?"),
        ("assistant", "It is sunny."),
    ]  # the tool's result passed over


def test_a_tool_calling_turn_keeps_its_question_in_the_history(alice_client, flow):
    """An assistant message with tool_calls and no text read as an answer being
    generated: the history left out the question with it and began with an orphan tool
    message. OpenAI's own shape (content null) was refused."""
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "What is the weather in Porto?"},
        {"role": "assistant", "content": None, "tool_calls": [call], "message_id": "step"},
        {"role": "tool", "tool_call_id": "c1", "content": "18C sunny"},
        {"role": "assistant", "content": "It is 18C and sunny in Porto.",
         "parent_message_id": "step"},
    ]  # fmt: skip
    response = alice_client.post(f"/api/v1/flows/{flow.pk}/runs",
                                 {"session_id": "tools", "messages": messages}, format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    assert [m["role"] for m in response.json()["messages"]] == ["user", "assistant"]
    history = alice_client.get(f"/api/v1/conversations/tools/history?flow={flow.pk}").json()
    assert history["messages"] == [
        {"role": "user", "content": "What is the weather in Porto?"},
        {"role": "assistant", "content": "It is 18C and sunny in Porto."}]  # fmt: skip
    _, answer = Message.objects.order_by("id")
    # It named the step, so it follows the step's parent: the message before (stored as
    # no parent and no new thread), as the history shows.
    assert (answer.parent_id, answer.starts_thread) == (None, False)
    # A step alone through /messages is refused, and so is null content without a call.
    step = {"flow": str(flow.pk), "session_id": "tools", **messages[1]}
    refused = alice_client.post("/api/v1/messages", step, format="json")
    assert refused.status_code == 400 and "tool_calls" in refused.json()["error"]["details"]
    null = {"flow": str(flow.pk), "session_id": "tools", "role": "user", "content": None}
    refused = alice_client.post("/api/v1/messages", null, format="json")
    assert refused.status_code == 400 and "content" in refused.json()["error"]["details"]
    assert Message.objects.count() == 2


def test_a_message_naming_a_step_follows_the_message_before_the_step(alice_client, flow):
    """A step's "previous" was read at the message naming it: a message in between
    became its parent. A run of steps alone said "A run needs at least one message"."""
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "A", "message_id": "u1"},
        {"role": "assistant", "content": None, "tool_calls": [call], "message_id": "t1"},
        {"role": "user", "content": "B", "message_id": "u2", "parent_message_id": None},
        {"role": "assistant", "content": "answer", "parent_message_id": "t1"},
    ]
    url = f"/api/v1/flows/{flow.pk}/runs"
    assert alice_client.post(url, {"session_id": "s", "messages": messages},
                             format="json").status_code == 201  # fmt: skip
    u1 = Message.objects.get(message_id="u1")
    assert Message.objects.get(text="answer").parent_id == u1.pk
    steps = alice_client.post(url, {"session_id": "s", "messages": messages[1:2]}, format="json")
    assert steps.status_code == 400
    assert steps.json()["error"]["details"] == {"messages": ["only tool-calling steps"]}
    assert Message.objects.count() == 3
