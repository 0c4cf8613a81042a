"""Dify's own test cases for thread extraction and TokenBufferMemory, replayed against
``GET /api/v1/conversations/{session_id}/history``.

The cases come from Dify's ``api/tests/unit_tests/core/prompt/test_extract_thread_messages.py``
and ``api/tests/unit_tests/core/memory/test_token_buffer_memory.py`` (langgenius/dify), as
Dify states them; the code is ours. Dify stores a question and its answer in one row; here
each is a message, so Dify's thread cases record one message per Dify row (ids are UUIDs the
caller chooses, ``UUID_NIL`` is Dify's "no parent: follows the previous message") and its
memory cases record the question and the answer as two messages. Every message is recorded
through ``POST /api/v1/messages``, one request each, oldest first.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.providers.tokens import count_message_tokens
from memories.conversations.history import MESSAGE_LIMIT_MAX
from memories.conversations.models import UUID_NIL

pytestmark = pytest.mark.django_db

NIL = "<UUID_NIL>"  # Dify's UUID_NIL parent
NULL = "<null>"  # an explicit null parent
IMAGE = {"type": "image_url", "image_url": {"url": "http://img"}}


@dataclass(frozen=True)
class Row:
    """One recorded message: Dify's id label, the parent (a label, NIL, NULL or None
    for omitted), role and content."""

    id: str
    parent: str | None
    role: str = "assistant"
    content: Any = "answer"


@dataclass(frozen=True)
class Case:
    rows: list[Row]  # oldest first
    query: dict[str, Any] = field(default_factory=dict)  # values may be callables of the rows
    ids: list[str] | None = None  # expected item ids, newest first (Dify's order)
    messages: list[tuple[str, Any]] | None = None  # expected (role, content), oldest first
    text: str | None = None  # expected text (format=text)
    thread_length: int | None = None
    message_limit: int | None = None


def _thread(*newest_first: tuple[str, str]) -> list[Row]:
    return [Row(i, parent) for i, parent in reversed(newest_first)]


def _qa(label: str, parent: str, query: Any, answer: Any) -> list[Row]:
    """Dify's one message (query + answer) as our two: question, then its answer."""
    return [Row(f"{label}.q", parent, "user", query), Row(label, f"{label}.q", "assistant", answer)]


def _budget(*pairs: tuple[str, str]) -> Callable[[], int]:
    """The token count of exactly these messages as a chat prompt."""
    return lambda: count_message_tokens([{"role": r, "content": c} for r, c in pairs])


CASES: dict[str, Case] = {
    # --- test_extract_thread_messages.py --------------------------------------------
    "single_message": Case(_thread(("id1", NIL)), ids=["id1"]),
    "linear_thread": Case(
        _thread(("id5", "id4"), ("id4", "id3"), ("id3", "id2"), ("id2", "id1"), ("id1", NIL)),
        ids=["id5", "id4", "id3", "id2", "id1"],
    ),
    "branched_thread": Case(
        _thread(("id4", "id2"), ("id3", "id2"), ("id2", "id1"), ("id1", NIL)),
        ids=["id4", "id2", "id1"],
    ),
    "empty_list": Case([], ids=[], thread_length=0),
    # Dify loads id3, id2, id1 of a conversation whose id1 follows id0: message_limit=3.
    "partially_loaded": Case(
        _thread(("id3", "id2"), ("id2", "id1"), ("id1", "id0"), ("id0", NIL)),
        query={"message_limit": 3},
        ids=["id3", "id2", "id1"],
    ),
    "legacy_messages": Case(
        _thread(("id3", NIL), ("id2", NIL), ("id1", NIL)), ids=["id3", "id2", "id1"]
    ),
    "mixed_with_legacy_messages": Case(
        _thread(("id5", "id4"), ("id4", "id2"), ("id3", "id2"), ("id2", NIL), ("id1", NIL)),
        ids=["id5", "id4", "id2", "id1"],
    ),
    "breaks_when_parent_is_none": Case(_thread(("id2", NULL), ("id1", NIL)), ids=["id2"]),
    "thread_length_excludes_newly_created_empty_answer": Case(
        _qa("id1", NIL, "q1", "ok") + _qa("id2", "id1", "q2", ""), thread_length=2
    ),
    "thread_length_keeps_non_empty_latest_answer": Case(
        _qa("id1", NIL, "q1", "older-answer") + _qa("id2", "id1", "q2", "latest-answer"),
        thread_length=4,
    ),
    # --- test_token_buffer_memory.py: get_history_prompt_messages --------------------
    "returns_empty_when_no_messages": Case([], messages=[]),
    "skips_first_message_without_answer": Case(_qa("m", NULL, "user query", ""), messages=[]),
    "message_with_answer_not_skipped": Case(
        _qa("m", NULL, "user query", "some answer"),
        messages=[("user", "user query"), ("assistant", "some answer")],
    ),
    "message_limit_default_is_500": Case([], message_limit=500),
    # Dify's maximum is 500 Dify rows; ours is MESSAGE_LIMIT_MAX messages.
    "message_limit_clipped_to_max": Case(
        [], query={"message_limit": 99_999}, message_limit=MESSAGE_LIMIT_MAX
    ),
    "message_limit_positive_used": Case([], query={"message_limit": 10}, message_limit=10),
    "message_limit_zero_uses_default": Case([], query={"message_limit": 0}, message_limit=500),
    "token_pruning_removes_oldest_messages": Case(
        _qa("m", NULL, "user query", "hello"),
        query={"max_tokens": _budget(("user", "user query"), ("assistant", "hello"))() - 1},
        messages=[],
    ),
    "token_pruning_removes_complete_oldest_turn": Case(
        _qa("first", NULL, "old query", "old answer")
        + _qa("second", "first", "new query", "new answer"),
        query={"max_tokens": _budget(("user", "new query"), ("assistant", "new answer"))()},
        messages=[("user", "new query"), ("assistant", "new answer")],
    ),
    "token_pruning_returns_empty_when_latest_turn_exceeds_limit": Case(
        _qa("m", NULL, "very large query", "very large answer"),
        query={"max_tokens": 1},
        messages=[],
    ),
    "token_pruning_drops_oversized_single_turn": Case(
        _qa("m", NULL, "user query", "hello " * 500), query={"max_tokens": 100}, messages=[]
    ),
    "no_pruning_when_within_limit": Case(
        _qa("m", NULL, "user query", "hello"),
        query={"max_tokens": 2000},
        messages=[("user", "user query"), ("assistant", "hello")],
    ),
    "plain_user_and_assistant_messages_returned": Case(
        _qa("m", NULL, "My query", "My answer"),
        messages=[("user", "My query"), ("assistant", "My answer")],
    ),
    # --- test_token_buffer_memory.py: get_history_prompt_text ------------------------
    "empty_messages_returns_empty_string": Case([], query={"format": "text"}, text=""),
    "user_and_assistant_messages_formatted": Case(
        _qa("m", NULL, "Hello", "World"),
        query={"format": "text", "human_prefix": "H", "ai_prefix": "A"},
        text="H: Hello\nA: World",
    ),
    "custom_prefixes_applied": Case(
        _qa("m", NULL, "Hi", "Bye"),
        query={"format": "text", "human_prefix": "Human", "ai_prefix": "Bot"},
        text="Human: Hi\nBot: Bye",
    ),
    "list_content_with_text_and_image": Case(
        [Row("m", NULL, "user", [{"type": "text", "text": "caption"}, IMAGE])],
        query={"format": "text"},
        text="Human: caption\n[image]",
    ),
    "list_content_text_only": Case(
        [Row("m", NULL, "user", [{"type": "text", "text": "just text"}])],
        query={"format": "text"},
        text="Human: just text",
    ),
    "list_content_image_only": Case(
        [Row("m", NULL, "user", [IMAGE])], query={"format": "text"}, text="Human: [image]"
    ),
    "unknown_role_skipped": Case(
        [Row("s", NULL, "system", "system instruction"), Row("u", "s", "user", "hi")],
        query={"format": "text"},
        text="Human: hi",
    ),
    "multiple_messages_joined_by_newline": Case(
        _qa("1", NULL, "Q1", "A1") + _qa("2", "1", "Q2", "A2"),
        query={"format": "text"},
        text="Human: Q1\nAssistant: A1\nHuman: Q2\nAssistant: A2",
    ),
    "assistant_list_content_formatted": Case(
        [
            Row("q", NULL, "user", "show me"),
            Row("a", "q", "assistant", [{"type": "text", "text": "response text"}, IMAGE]),
        ],
        query={"format": "text"},
        text="Human: show me\nAssistant: response text\n[image]",
    ),
}


def _record(client, flow, rows: list[Row]) -> dict[str, str]:
    """Record the rows; returns label -> the caller id (a UUID) used for it."""
    ids = {row.id: str(uuid.uuid4()) for row in rows}
    for row in rows:
        body: dict[str, Any] = {
            "flow": str(flow.pk),
            "session_id": "conversation-1",
            "role": row.role,
            "content": row.content,
            "message_id": ids[row.id],
        }
        if row.parent is not None:
            body["parent_message_id"] = {NIL: UUID_NIL, NULL: None}.get(row.parent) or ids.get(
                row.parent
            )
        response = client.post("/api/v1/messages", body, format="json")
        assert response.status_code == 201, response.json()
        assert response.json()["message_id"] == ids[row.id]
    return ids


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_dify_case(alice_client, flow, case: Case):
    ids = _record(alice_client, flow, case.rows)
    query = {"flow": str(flow.pk), "max_tokens": 100_000, **case.query}
    response = alice_client.get("/api/v1/conversations/conversation-1/history", query)
    assert response.status_code == 200, response.json()
    body = response.json()
    if case.ids is not None:
        assert [item["message_id"] for item in body["items"]] == [ids[i] for i in case.ids[::-1]]
    if case.messages is not None:
        assert [(m["role"], m["content"]) for m in body["messages"]] == case.messages
        assert body["token_count"] == (
            count_message_tokens(body["messages"]) if body["messages"] else 0
        )
    if case.text is not None:
        assert body["text"] == case.text
    if case.thread_length is not None:
        assert body["thread_length"] == case.thread_length
    if case.message_limit is not None:
        assert body["message_limit"] == case.message_limit


def test_dify_cases_cover_both_files():
    """The set above is the cases of Dify's two files that a history endpoint can show
    (the rest test Dify's own mocks: repositories, file factories, app modes)."""
    assert len(CASES) == 32
