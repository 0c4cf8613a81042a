"""The contract suite for the chat proxy's tool loop: the model's memory tool calls carry
arguments in the styles models write (``tests/contract/corpus.py``). Readable ones run;
the rest go back to the model as an error it can act on (the loop goes on, the client
gets the final answer); a refusal or an empty answer is relayed as it came."""

from __future__ import annotations

import json

import openai
import pytest

from core.services import api_key_create
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_list
from tests.contract.corpus import REFUSAL, THINKING, wrap
from tests.fakes.openai_server import Scripted, chat_body

pytestmark = pytest.mark.django_db(transaction=True)
USER = {"X-OpenWebUI-User-Id": "alice"}
JAZZ = "User likes jazz"
ARGUMENTS = json.dumps({"content": JAZZ})


def _call(arguments) -> Scripted:
    body = chat_body("")
    body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "manage_memory", "arguments": arguments}}]}  # fmt: skip
    body["choices"][0]["finish_reason"] = "tool_calls"
    return Scripted(body=body)


def _ask(live_server, owner):
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key=api_key_create(owner=owner)[1],
                           default_headers=USER, max_retries=0)  # fmt: skip
    return client.chat.completions.create(
        model="fake-model", extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Remember that I like jazz."}],
    )  # fmt: skip


def _facts(owner) -> list[str]:
    row = scope_find(owner=owner, scope=("user", "alice"))
    return [] if row is None else sorted(f.content for f in fact_list(scope=row))


READABLE = [
    *wrap(ARGUMENTS),
    ("truncated", ARGUMENTS[:-1]),
    ("single-quotes", "{'content': '" + JAZZ + "',}"),
    ("an-object-not-a-string", {"content": JAZZ}),
]


@pytest.mark.parametrize(("style", "arguments"), READABLE, ids=[r[0] for r in READABLE])
def test_readable_tool_arguments_run(live_server, alice, llm_settings, openai_server, style,
                                     arguments):  # fmt: skip
    openai_server.push(_call(arguments), Scripted(body=chat_body("Noted.")))
    answer = _ask(live_server, alice)
    ran = answer.model_extra["memory_tool_calls"]
    assert [(r["name"], r["arguments"]) for r in ran] == [("manage_memory", {"content": JAZZ})]
    assert ran[0]["result"]["content"] == JAZZ and "error" not in ran[0]
    assert answer.choices[0].message.content == "Noted." and _facts(alice) == [JAZZ]


UNREADABLE = [
    ("empty", "", "content is required to create a memory"),
    ("missing-fields", "{}", "content is required to create a memory"),
    ("extra-fields", json.dumps({"content": JAZZ, "importance": 5}),
     "invalid arguments: Additional properties are not allowed"),
    ("wrong-types", json.dumps({"content": 42}), "invalid arguments: content: 42 is not of type"),
    ("garbage", "remember jazz please", "the arguments are not valid JSON"),
    ("cut-to-nothing", "{not json", "the arguments are not valid JSON"),
    ("only-thinking", THINKING.replace("</think>", ""), "content is required to create a memory"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("style", "arguments", "error"), UNREADABLE, ids=[u[0] for u in UNREADABLE]
)
def test_unreadable_tool_arguments_go_back_to_the_model(live_server, alice, llm_settings,
                                                        openai_server, style, arguments, error):  # fmt: skip
    openai_server.push(_call(arguments), Scripted(body=chat_body("Sorry, I could not save it.")))
    answer = _ask(live_server, alice)
    (ran,) = answer.model_extra["memory_tool_calls"]
    assert error in ran["error"] and "result" not in ran
    if "not valid JSON" in error:  # (the report shows what the model sent)
        assert ran["arguments"] == arguments
    sent = [r["json"] for r in openai_server.requests if r["path"].endswith("/chat/completions")]
    assert json.loads(sent[1]["messages"][-1]["content"]) == {"error": ran["error"]}
    assert answer.choices[0].message.content == "Sorry, I could not save it."
    assert _facts(alice) == []


@pytest.mark.parametrize("text", [REFUSAL, ""], ids=["refusal", "empty-answer"])
def test_a_refusal_or_an_empty_answer_is_relayed_as_it_came(live_server, alice, llm_settings,
                                                            openai_server, text):  # fmt: skip
    openai_server.push(Scripted(body=chat_body(text)))
    answer = _ask(live_server, alice)
    assert answer.choices[0].message.content == text
    assert answer.model_extra["memory_tool_calls"] == [] and _facts(alice) == []
