"""docs/tools.md's OpenAI function-calling example, run as written: its Python block
(marked ``<!-- run: function-calling -->``) is executed unchanged against a live server,
with the model it calls (``OpenAI()`` reads ``OPENAI_BASE_URL``) the scripted fake on
127.0.0.1, which asks for two tool calls at once and then answers."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from core.services import api_key_create
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_list
from tests.fakes.openai_server import Scripted, chat_body
from tests.readme import readme_block

pytestmark = pytest.mark.django_db(transaction=True)
RUNS = {"function-calling"}  # the docs' blocks this module runs (tests/test_docs.py)
CALLS = [
    {"id": "call_a", "type": "function", "function": {
        "name": "manage_memory", "arguments": '{"content": "User prefers dark mode"}'}},
    {"id": "call_b", "type": "function", "function": {
        "name": "search_memory", "arguments": '{"query": "theme", "limit": 0}'}},
]  # fmt: skip


def test_the_readme_function_calling_example_runs_as_written(
    live_server, alice, openai_server, monkeypatch
):
    asked = chat_body("")
    asked["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": CALLS}
    asked["choices"][0]["finish_reason"] = "tool_calls"
    openai_server.push(Scripted(body=asked), Scripted(body=chat_body("Noted: dark mode.")))
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("MEMORY_URL", live_server.url)
    monkeypatch.setenv("MEMORY_API_KEY", api_key_create(owner=alice)[1])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(
            compile(readme_block("function-calling", "python"), "docs/tools.md", "exec"),
            {"__name__": "readme"},
        )

    assert printed.getvalue() == "Noted: dark mode.\n"
    first, second = [r["json"] for r in openai_server.requests]
    assert [t["function"]["name"] for t in first["tools"]] == [
        "manage_memory", "search_memory", "retrieve_node_memory", "write_node_memory",
    ]  # fmt: skip
    assert second["tools"] == first["tools"]
    user, assistant, *results = second["messages"]
    assert user == {"role": "user", "content": "Remember that I prefer dark mode."}
    # The assistant's turn once, with both calls, then one tool message per call.
    assert (assistant["role"], assistant["tool_calls"]) == ("assistant", CALLS)
    assert [m["tool_call_id"] for m in results] == ["call_a", "call_b"]
    assert [m["role"] for m in results] == ["tool", "tool"]
    created, refused = (json.loads(m["content"]) for m in results)
    assert created["action"] == "created" and created["content"] == "User prefers dark mode"
    assert refused == {
        "code": "invalid_arguments",
        "message": "invalid arguments: limit: 0 is less than the minimum of 1",
        "details": {"limit": ["0 is less than the minimum of 1"]},
    }  # an error goes back to the model too
    row = scope_find(owner=alice, scope=("user", "alice"))
    assert [f.content for f in fact_list(scope=row)] == ["User prefers dark mode"]
