"""Caller message ids, parents of either kind, null parents, pending answers and images,
through ``POST /api/v1/messages`` and ``POST /api/v1/flows/{id}/runs``."""

from __future__ import annotations

import pytest

from memories.conversations.models import UUID_NIL, Message

pytestmark = pytest.mark.django_db
HISTORY = "/api/v1/conversations/s1/history"
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


def _post(client, flow, **fields):
    body = {"flow": str(flow.pk), "session_id": "s1", "role": "user", "content": "hi", **fields}
    return client.post("/api/v1/messages", body, format="json")


def _rows(flow):
    return list(
        Message.objects.filter(flow=flow)
        .order_by("pk")
        .values_list("message_id", "parent_id", "starts_thread", "text")
    )


def _history(client, flow, **params):
    response = client.get(HISTORY, {"flow": str(flow.pk), **params})
    assert response.status_code == 200, response.json()
    return response.json()


def test_caller_ids_round_trip_and_parents_of_either_kind(alice_client, flow):
    q = _post(alice_client, flow, message_id="q-1").json()
    assert (q["message_id"], q["parent_message_id"], q["starts_thread"]) == ("q-1", None, False)
    a = _post(
        alice_client, flow, role="assistant", content="A", message_id="a-1", parent_message_id="q-1"
    ).json()
    assert a["parent_message_id"] == "q-1"
    # A parent named by its server id, as an integer or as digits; a message without a
    # caller id is shown by its server id.
    b = _post(alice_client, flow, content="B", parent_message_id=a["id"]).json()
    assert (b["message_id"], b["parent_message_id"]) == (b["id"], "a-1")
    c = _post(alice_client, flow, role="assistant", content="C", parent_message_id=str(b["id"]))
    assert c.json()["parent_message_id"] == b["id"]
    items = _history(alice_client, flow)["items"]
    assert [(i["message_id"], i["parent_message_id"]) for i in items] == [
        ("q-1", None),
        ("a-1", "q-1"),
        (b["id"], "a-1"),
        (c.json()["id"], b["id"]),
    ]
    assert [i["id"] for i in items] == [q["id"], a["id"], b["id"], c.json()["id"]]
    # current_message_id names either kind too.
    assert [i["content"] for i in _history(alice_client, flow, current_message_id="a-1")["items"]]
    older = _history(alice_client, flow, current_message_id="a-1")["messages"]
    assert older == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "A"}]
    listed = alice_client.get("/api/v1/messages", {"session_id": "s1"}).json()["results"]
    assert [m["parent_message_id"] for m in listed] == [None, "q-1", "a-1", b["id"]]


def test_a_run_may_name_its_own_earlier_messages(alice_client, flow):
    _post(alice_client, flow, message_id="old")
    response = alice_client.post(
        f"/api/v1/flows/{flow.pk}/runs",
        {
            "session_id": "s1",
            "messages": [
                {"role": "user", "content": "Q", "message_id": "q", "parent_message_id": None},
                {"role": "assistant", "content": "A", "message_id": "a", "parent_message_id": "q"},
            ],
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    stored = response.json()["messages"]
    assert [(m["message_id"], m["parent_message_id"], m["starts_thread"]) for m in stored] == [
        ("q", None, True),
        ("a", "q", False),
    ]
    # The explicit null parent rooted a new thread: "old" is not in the history.
    assert [i["message_id"] for i in _history(alice_client, flow)["items"]] == ["q", "a"]


def test_uuid_nil_and_omitted_parents_follow_the_previous_message(alice_client, flow):
    _post(alice_client, flow, message_id="1")
    _post(
        alice_client,
        flow,
        role="assistant",
        content="x",
        message_id="2",
        parent_message_id=UUID_NIL,
    )
    _post(alice_client, flow, message_id="3")
    assert _rows(flow) == [
        ("1", None, False, "hi"),
        ("2", None, False, "x"),
        ("3", None, False, "hi"),
    ]
    assert [i["message_id"] for i in _history(alice_client, flow)["items"]] == ["1", "2", "3"]


@pytest.mark.parametrize(
    "fields, status, code, message",
    [
        (
            {"message_id": "dup"},
            409,
            "duplicate_message",
            "Message id dup is already used in conversation 's1'.",
        ),
        (
            {"parent_message_id": "nope"},
            422,
            "unknown_parent",
            "Parent message 'nope' is not in conversation 's1'; a message can only follow a "
            "message recorded before it.",
        ),
        (
            {"parent_message_id": 999999},
            422,
            "unknown_parent",
            "Parent message 999999 is not in conversation 's1'; a message can only follow a "
            "message recorded before it.",
        ),
        (
            {"message_id": UUID_NIL},
            400,
            "invalid",
            f"message_id: may not be {UUID_NIL} (it means 'no parent').",
        ),
        ({"message_id": "x" * 201}, 400, "invalid", None),
        ({"parent_message_id": 0}, 400, "invalid", None),
        ({"parent_message_id": ""}, 400, "invalid", None),
        ({"content": ""}, 400, "invalid", None),  # a user message needs text or an image
    ],
)
def test_bad_ids_are_refused_and_write_nothing(alice_client, flow, fields, status, code, message):
    _post(alice_client, flow, message_id="dup")
    before = _rows(flow)
    response = _post(alice_client, flow, **fields)
    assert response.status_code == status, response.json()
    error = response.json()["error"]
    assert error["code"] == code
    if message:
        assert error["message"] == message
    assert "ErrorDetail" not in str(error)
    assert _rows(flow) == before


def test_a_caller_id_is_unique_per_conversation_only(alice_client, flow):
    assert _post(alice_client, flow, message_id="m").status_code == 201
    assert _post(alice_client, flow, message_id="m", session_id="s2").status_code == 201
    run = alice_client.post(
        f"/api/v1/flows/{flow.pk}/runs",
        {
            "session_id": "s3",
            "messages": [
                {"role": "user", "content": "a", "message_id": "z"},
                {"role": "user", "content": "b", "message_id": "z"},
            ],
        },
        format="json",
    )
    assert run.status_code == 409 and run.json()["error"]["code"] == "duplicate_message"
    assert not Message.objects.filter(session_id="s3").exists()


def test_pending_answer_is_accepted_and_left_out_with_its_question(alice_client, flow):
    _post(alice_client, flow, content="Q1", message_id="q1")
    _post(alice_client, flow, role="assistant", content="A1", message_id="a1")
    _post(alice_client, flow, content="Q2", message_id="q2")
    pending = _post(alice_client, flow, role="assistant", content="", message_id="a2")
    assert pending.status_code == 201 and pending.json()["text"] == ""
    body = _history(alice_client, flow)
    assert body["messages"] == [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
    ]
    assert (body["thread_length"], body["truncated"]) == (2, 0)


def test_image_only_messages_are_accepted_and_keep_their_blocks(alice_client, flow):
    response = _post(alice_client, flow, content=[IMAGE])
    assert response.status_code == 201, response.json()
    _post(alice_client, flow, role="assistant", content=[{"type": "text", "text": "A cat."}])
    body = _history(alice_client, flow)
    assert body["messages"] == [
        {"role": "user", "content": [IMAGE]},
        {"role": "assistant", "content": "A cat."},
    ]
    text = _history(alice_client, flow, format="text")["text"]
    assert text == "Human: [image]\nAssistant: A cat."


@pytest.mark.parametrize("block", [
    {"type": "image_url"}, {"type": "image_url", "image_url": {}},
    {"type": "image_url", "image_url": "notadict"},
    {"type": "image_url", "image_url": {"url": "javascript:alert(1)"}},
])  # fmt: skip
def test_an_image_url_block_without_a_web_or_data_url_is_refused(alice_client, flow, block):
    """Stored, then replayed to a model in every history, which no provider takes."""
    response = _post(alice_client, flow, content=[block])
    assert response.status_code == 400, response.content
    assert "image_url" in response.json()["error"]["message"] and _rows(flow) == []
    data_url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}
    assert _post(alice_client, flow, content=[data_url]).status_code == 201


def test_content_is_always_blocks(alice_client, flow):
    """One shape per field: a message sent as a string answers its content as one text
    block beside its text (not ``[]``); one sent as blocks answers them."""
    sent = _post(alice_client, flow, content="Hello there").json()
    assert (sent["text"], sent["content"]) == (
        "Hello there",
        [{"type": "text", "text": "Hello there"}],
    )
    blocks = [{"type": "text", "text": "Look:"}, IMAGE]
    sent = _post(alice_client, flow, content=blocks).json()
    assert sent["content"] == blocks


def test_a_runs_nil_message_id_is_named_by_its_path(alice_client, flow):
    before = _rows(flow)
    response = alice_client.post(f"/api/v1/flows/{flow.pk}/runs", {"session_id": "s1",
                                 "messages": [{"role": "user", "content": "a"},
                                              {"role": "assistant", "content": "b",
                                               "message_id": UUID_NIL}]},
                                 format="json")  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    said = f"may not be {UUID_NIL} (it means 'no parent')."
    assert error["message"] == f"messages[1].message_id: {said}"
    assert _rows(flow) == before


def test_a_bad_node_id_is_named_by_its_path(alice_client, flow):
    response = alice_client.get("/api/v1/conversations/desk-1/nodes/bad%20node/history",
                                {"flow": str(flow.pk)})  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    said = "must be 1-128 letters, digits and . _ -, starting with a letter or digit"
    assert (error["message"], error["details"]) == (f"node_id: {said}", {"node_id": [said]})
