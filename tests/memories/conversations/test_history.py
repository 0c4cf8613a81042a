"""Conversation memory: thread extraction, token budget, files, API, tenancy, bad input."""

from __future__ import annotations

import pytest

from core.providers.tokens import count_message_tokens, count_tokens
from memories.bases.services import messages_record
from memories.conversations.history import (
    HistoryError,
    TokenBufferMemory,
    UnknownMessage,
    conversation_history,
    extract_thread,
)
from memories.conversations.models import Message
from memories.conversations.services import PREVIOUS, MessageIn, flow_create

pytestmark = pytest.mark.django_db
ERR = {"code", "message", "details"}
IMAGE = {
    "type": "image",
    "transfer_method": "local_file",
    "upload_file_id": "file-uuid-123",
    "belongs_to": "user",
}
LINK = {"type": "document", "transfer_method": "remote_url", "url": "https://example.com/a.pdf"}


def _say(flow, session_id, role, text, parent=None, files=None) -> Message:
    (message,) = messages_record(
        flow=flow,
        session_id=session_id,
        run_id="r",
        messages=[
            MessageIn(
                role=role, text=text, parent=parent.pk if parent else PREVIOUS, files=files or []
            )
        ],
    )
    return message


@pytest.fixture
def seed_thread(flow):
    """The seed's example: A'' regenerates the answer to A, then C follows A''."""
    m = {}
    m["A"] = _say(flow, "s1", "user", "A")
    m["A'"] = _say(flow, "s1", "assistant", "A'", m["A"])
    m["B"] = _say(flow, "s1", "user", "B", m["A'"])
    m["B'"] = _say(flow, "s1", "assistant", "B'", m["B"])
    m["A''"] = _say(flow, "s1", "assistant", "A''", m["A"])
    m["C"] = _say(flow, "s1", "user", "C", m["A''"])
    m["C'"] = _say(flow, "s1", "assistant", "C'", m["C"])
    return m


def _url(session_id="s1"):
    return f"/api/v1/conversations/{session_id}/history"


def _contents(history):
    return [item.content for item in history.items]


# --- thread extraction --------------------------------------------------------------
def test_seed_regeneration_example(flow, seed_thread):
    history = conversation_history(flow=flow, session_id="s1")
    assert _contents(history) == ["A", "A''", "C", "C'"]
    assert [i.role for i in history.items] == ["user", "assistant", "user", "assistant"]
    assert [i.message_id for i in history.items] == [
        seed_thread[k].pk for k in ("A", "A''", "C", "C'")
    ]
    assert (history.thread_length, history.truncated) == (4, 0)


@pytest.mark.parametrize(
    "current, expected",
    [
        ("B'", ["A", "A'", "B", "B'"]),
        ("B", ["A", "A'", "B"]),
        ("A''", ["A", "A''"]),
        ("A", ["A"]),
        ("C", ["A", "A''", "C"]),
    ],
)
def test_thread_of_an_older_message(flow, seed_thread, current, expected):
    history = conversation_history(
        flow=flow, session_id="s1", current_message_id=seed_thread[current].pk
    )
    assert _contents(history) == expected


def test_linear_history_without_parents_is_one_thread(flow):
    for i, role in enumerate(["user", "assistant", "user", "assistant"]):
        _say(flow, "s1", role, f"m{i}")
    assert _contents(conversation_history(flow=flow, session_id="s1")) == ["m0", "m1", "m2", "m3"]


def test_a_message_without_parent_follows_the_one_before_it(flow):
    """Runs record the user message with a parent and the reply without one."""
    a = _say(flow, "s1", "user", "A")
    _say(flow, "s1", "assistant", "A'")
    _say(flow, "s1", "assistant", "A''", a)  # regenerated answer
    _say(flow, "s1", "user", "C")  # linear again: follows A''
    assert _contents(conversation_history(flow=flow, session_id="s1")) == ["A", "A''", "C"]


def test_extract_thread_null_parent_modes_and_turns():
    rows = [("c", "b"), ("x", None), ("b", None), ("a", None)]  # newest first

    def walk(items, mode):
        return extract_thread(items, key=lambda r: r[0], parent=lambda r: r[1], null_parent=mode)

    assert walk(rows, "root") == [("c", "b"), ("b", None)]
    assert walk(rows, "linear") == [("c", "b"), ("b", None), ("a", None)]
    # Consecutive items with one key are one turn (node memory: user + assistant).
    turns = [("t3", "t1"), ("t3", "t1"), ("t2", "t1"), ("t2", "t1"), ("t1", None), ("t1", None)]
    assert walk(turns, "root") == [("t3", "t1"), ("t3", "t1"), ("t1", None), ("t1", None)]


def test_message_limit_bounds_the_candidates(flow, seed_thread):
    history = conversation_history(flow=flow, session_id="s1", message_limit=3)
    # Candidates C', C, A'': the walk ends where the parent (A) is not a candidate.
    assert _contents(history) == ["A''", "C", "C'"]


def test_other_sessions_and_flows_are_not_candidates(alice, flow, seed_thread):
    other_flow = flow_create(owner=alice, name="other")
    _say(flow, "s2", "user", "elsewhere")
    _say(other_flow, "s1", "user", "other flow")
    assert _contents(conversation_history(flow=flow, session_id="s1")) == ["A", "A''", "C", "C'"]


# --- token budget -------------------------------------------------------------------
TEXTS = [
    "The first message talks about the weather in Lisbon in spring.",
    "Sunny, about twenty degrees, with a breeze from the Atlantic.",
    "What about restaurants near the river?",
    "Try the fish places in Cais do Sodré; book ahead on weekends.",
    "And museums?",
    "The tile museum is a short bus ride east of the centre.",
]


def _cost(role: str, text: str) -> int:
    """What one message adds to count_message_tokens."""
    return count_message_tokens([{"role": role, "content": text}]) - 3


@pytest.fixture
def six(flow):
    roles = ["user", "assistant"] * 3
    return [_say(flow, "s1", role, text) for role, text in zip(roles, TEXTS)]


@pytest.mark.parametrize("keep", [2, 4, 6])
def test_truncation_keeps_the_newest_whole_turns_within_the_budget_exactly(flow, six, keep):
    newest = six[-keep:]
    budget = 3 + sum(_cost(m.role, m.text) for m in newest)
    at_budget = conversation_history(flow=flow, session_id="s1", max_tokens=budget)
    assert [i.message_id for i in at_budget.items] == [m.pk for m in newest]
    assert at_budget.token_count == budget == count_message_tokens(at_budget.as_messages())
    assert at_budget.truncated == 6 - keep
    assert [i.token_count for i in at_budget.items] == [count_tokens(m.text) for m in newest]

    # One token less drops the oldest kept turn whole (question and answer).
    one_less = conversation_history(flow=flow, session_id="s1", max_tokens=budget - 1)
    assert [i.message_id for i in one_less.items] == [m.pk for m in newest[2:]]
    expected_tokens = count_message_tokens(one_less.as_messages()) if keep > 2 else 0
    assert one_less.token_count == expected_tokens
    assert one_less.truncated == 6 - keep + 2


@pytest.mark.parametrize("max_tokens", [1, 3 + _cost("user", TEXTS[4]) + 1])
def test_a_newest_turn_over_the_budget_gives_an_empty_history(flow, six, max_tokens):
    history = conversation_history(flow=flow, session_id="s1", max_tokens=max_tokens)
    assert history.items == [] and history.as_messages() == [] and history.as_text() == ""
    assert (history.token_count, history.thread_length, history.truncated) == (0, 6, 6)


def test_an_answer_is_never_kept_without_its_question(flow, six):
    """max_tokens=22 kept the last answer alone before turns were whole."""
    history = conversation_history(flow=flow, session_id="s1", max_tokens=22)
    roles = [i.role for i in history.items]
    assert roles[:1] != ["assistant"] and len(roles) % 2 == 0


def test_truncation_applies_to_the_thread_only(flow, seed_thread):
    budget = 3 + _cost("user", "C") + _cost("assistant", "C'")
    history = conversation_history(flow=flow, session_id="s1", max_tokens=budget)
    assert _contents(history) == ["C", "C'"]
    assert (history.thread_length, history.truncated) == (4, 2)


def test_history_queries_scan_then_fetch_the_kept_contents(
    flow, seed_thread, django_assert_num_queries
):
    with django_assert_num_queries(2):  # (id, parent) scan, then one batch of contents
        conversation_history(flow=flow, session_id="s1")
    with django_assert_num_queries(3):  # the current message's position first
        conversation_history(flow=flow, session_id="s1", current_message_id=seed_thread["B"].pk)


def test_contents_are_fetched_in_growing_batches_only_as_far_as_needed(
    flow, django_assert_num_queries
):
    messages_record(
        flow=flow,
        session_id="s1",
        run_id="r",
        messages=[MessageIn(role="user", text=f"note {i}") for i in range(40)],
    )
    cost = _cost("user", "note 7")
    assert all(_cost("user", f"note {i}") == cost for i in range(40))
    # A 640-token budget: first batch 16 messages, then 32; all 40 fit.
    with django_assert_num_queries(3):
        history = conversation_history(flow=flow, session_id="s1", max_tokens=640)
    assert _contents(history) == [f"note {i}" for i in range(40)]
    assert history.token_count == 3 + 40 * cost <= 640
    # Only the newest 10 fit: the first batch is enough.
    with django_assert_num_queries(2):
        history = conversation_history(flow=flow, session_id="s1", max_tokens=3 + 10 * cost)
    assert _contents(history) == [f"note {i}" for i in range(30, 40)]


# --- bad input (service) ------------------------------------------------------------
def test_service_bad_input(flow, seed_thread):
    with pytest.raises(UnknownMessage):
        conversation_history(flow=flow, session_id="nobody", current_message_id=1)
    other = _say(flow, "s2", "user", "x")
    with pytest.raises(UnknownMessage):
        conversation_history(flow=flow, session_id="s1", current_message_id=other.pk)
    with pytest.raises(HistoryError, match="max_tokens must be at least 1"):
        conversation_history(flow=flow, session_id="s1", max_tokens=0)
    with pytest.raises(HistoryError, match="message_limit must be 0"):
        conversation_history(flow=flow, session_id="s1", message_limit=-1)


def test_token_buffer_memory_object(flow, seed_thread):
    memory = TokenBufferMemory(flow=flow, conversation_id="s1")
    assert memory.get_history_prompt_messages() == [
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "A''"},
        {"role": "user", "content": "C"},
        {"role": "assistant", "content": "C'"},
    ]
    older = memory.get_history(current_message_id=seed_thread["B'"].pk, max_token_limit=2000)
    assert _contents(older) == ["A", "A'", "B", "B'"]


# --- API ----------------------------------------------------------------------------
def test_api_history_messages_format(alice_client, flow, seed_thread):
    response = alice_client.get(_url(), {"flow": str(flow.pk)})
    assert response.status_code == 200
    body = response.json()
    expected = [("user", "A"), ("assistant", "A''"), ("user", "C"), ("assistant", "C'")]
    assert body["messages"] == [{"role": r, "content": c} for r, c in expected]
    assert "text" not in body
    assert body["format"] == "messages"
    assert body["token_count"] == count_message_tokens(body["messages"])
    assert (body["max_tokens"], body["thread_length"], body["truncated"]) == (2000, 4, 0)
    first = body["items"][0]
    assert first["message_id"] == seed_thread["A"].pk and first["parent_message_id"] is None
    assert body["items"][1]["parent_message_id"] == seed_thread["A"].pk
    assert [i["token_count"] for i in body["items"]] == [1, count_tokens("A''"), 1, 2]


def test_api_history_text_format_with_prefixes(alice_client, flow, seed_thread):
    response = alice_client.get(
        _url(),
        {
            "flow": str(flow.pk),
            "format": "text",
            "human_prefix": "User",
            "ai_prefix": "Bot",
            "current_message_id": seed_thread["B'"].pk,
        },
    )
    assert response.status_code == 200
    body = response.json()
    assert body["text"] == "User: A\nBot: A'\nUser: B\nBot: B'"
    assert "messages" not in body
    default = alice_client.get(_url(), {"flow": str(flow.pk), "format": "text"}).json()
    assert default["text"] == "Human: A\nAssistant: A''\nHuman: C\nAssistant: C'"


@pytest.mark.parametrize("prefix", ["a\nb", "Human: x\rAssistant", "tab\there", "p\u2028q"])
def test_a_prefix_with_a_line_break_is_refused(alice_client, flow, seed_thread, prefix):
    """human_prefix=a%0Ab wrote transcript lines no one said."""
    for name in ("human_prefix", "ai_prefix"):
        response = alice_client.get(_url(), {"flow": str(flow.pk), "format": "text", name: prefix})
        assert response.status_code == 400, response.content
        assert response.json()["error"]["details"] == {
            name: ["A prefix may not hold a line break or control character."]}  # fmt: skip


def test_api_history_budget_and_limit(alice_client, flow, six):
    budget = 3 + _cost("user", TEXTS[4]) + _cost("assistant", TEXTS[5])
    body = alice_client.get(_url(), {"flow": str(flow.pk), "max_tokens": budget}).json()
    assert [m["content"] for m in body["messages"]] == TEXTS[4:]
    assert body["token_count"] == budget and body["truncated"] == 4
    limited = alice_client.get(_url(), {"flow": str(flow.pk), "message_limit": 2}).json()
    assert [m["content"] for m in limited["messages"]] == TEXTS[4:]
    assert limited["thread_length"] == 2


def test_api_files_round_trip(alice_client, flow):
    response = alice_client.post(
        f"/api/v1/flows/{flow.pk}/runs",
        {
            "session_id": "s1",
            "messages": [
                {"role": "user", "content": "look at these", "files": [IMAGE, LINK]},
                {"role": "assistant", "content": "a landscape"},
            ],
        },
        format="json",
    )
    assert response.status_code == 201
    items = alice_client.get(_url(), {"flow": str(flow.pk)}).json()["items"]
    assert [i["files"] for i in items] == [[IMAGE, LINK], []]


def test_api_session_ids_with_slashes(alice_client, flow):
    _say(flow, "user/42", "user", "hello")
    body = alice_client.get(_url("user/42"), {"flow": str(flow.pk)}).json()
    assert body["messages"] == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    "params, status, code",
    [
        ({}, 400, "invalid"),
        ({"flow": "not-a-uuid"}, 400, "invalid"),
        ({"max_tokens": 0}, 400, "invalid"),
        ({"max_tokens": -5}, 400, "invalid"),
        ({"message_limit": -1}, 400, "invalid"),
        ({"format": "xml"}, 400, "invalid"),
        ({"current_message_id": "x" * 201}, 400, "invalid"),
        ({"current_message_id": "abc"}, 422, "unknown_message"),
    ],
)
def test_api_bad_input(alice_client, flow, seed_thread, params, status, code):
    if params:
        params = {"flow": str(flow.pk), **params}
    response = alice_client.get(_url(), params)
    assert response.status_code == status
    assert set(response.json()["error"]) == ERR
    assert response.json()["error"]["code"] == code


def test_api_unknown_conversation_is_an_empty_history(alice_client, flow):
    response = alice_client.get(_url("nobody"), {"flow": str(flow.pk)})
    assert response.status_code == 200
    body = response.json()
    assert (body["messages"], body["items"], body["token_count"]) == ([], [], 0)
    assert (body["thread_length"], body["truncated"]) == (0, 0)


def test_api_current_message_outside_the_conversation_is_422(alice_client, flow, seed_thread):
    elsewhere = _say(flow, "s2", "user", "other conversation")
    response = alice_client.get(_url(), {"flow": str(flow.pk), "current_message_id": elsewhere.pk})
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "unknown_message",
        "message": f"Message {elsewhere.pk} is not part of conversation 's1'.",
        "details": {"current_message_id": str(elsewhere.pk)},
    }


def test_tenant_isolation(alice_client, bob_client, anon_client, bob, flow, seed_thread):
    before = list(Message.objects.order_by("pk").values_list("pk", "text", "parent_id"))
    # Bob cannot read Alice's conversation through her flow id...
    response = bob_client.get(_url(), {"flow": str(flow.pk)})
    assert response.status_code == 404 and set(response.json()["error"]) == ERR
    assert anon_client.get(_url(), {"flow": str(flow.pk)}).status_code == 401
    # ...nor point at her messages from his own conversation of the same session id.
    bobs_flow = flow_create(owner=bob, name="bobs")
    _say(bobs_flow, "s1", "user", "bob's")
    response = bob_client.get(
        _url(), {"flow": str(bobs_flow.pk), "current_message_id": seed_thread["C'"].pk}
    )
    assert response.status_code == 422
    body = bob_client.get(_url(), {"flow": str(bobs_flow.pk)}).json()
    assert body["messages"] == [{"role": "user", "content": "bob's"}]
    # Alice's own view is unchanged by all of this.
    assert [
        m["content"] for m in alice_client.get(_url(), {"flow": str(flow.pk)}).json()["messages"]
    ] == ["A", "A''", "C", "C'"]
    after = list(
        Message.objects.filter(flow=flow).order_by("pk").values_list("pk", "text", "parent_id")
    )
    assert after == before
