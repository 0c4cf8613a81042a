"""Opt-in server-side memory tools in the chat proxy: the proxy offers manage_memory and
search_memory, runs the model's calls itself in a bounded loop, then answers (streamed
or not); driven by the official openai client against the scripted upstream."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from core.services import api_key_create
from memories.engine.owner_settings import engine_settings_update
from memories.facts.models import Fact
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_list
from tests.fakes.openai_server import Scripted, chat_body

pytestmark = pytest.mark.django_db(transaction=True)
USER = {"X-OpenWebUI-User-Id": "alice"}
CLIENT_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time.", "parameters": {"type": "object",
                                                                               "properties": {}}},
}  # fmt: skip


def _calls(*calls: tuple[str, dict]) -> Scripted:
    body = chat_body("")
    body["choices"][0]["message"] = {
        "role": "assistant", "content": None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}
            for i, (name, arguments) in enumerate(calls)
        ],
    }  # fmt: skip
    body["choices"][0]["finish_reason"] = "tool_calls"
    return Scripted(body=body)


def _streamed_call(name: str, arguments: dict) -> Scripted:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    text = json.dumps(arguments)
    deltas = [
        {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": "call_s", "type": "function",
             "function": {"name": name, "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": text[:5]}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": text[5:]}}]},
    ]  # fmt: skip
    chunks = [
        {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return Scripted(stream_chunks=chunks)


def _streamed_text(*pieces: str) -> Scripted:
    base = {"id": "c2", "object": "chat.completion.chunk", "created": 2, "model": "m"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
        for p in pieces
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return Scripted(stream_chunks=chunks)


def _client(live_server, owner) -> openai.OpenAI:
    key = api_key_create(owner=owner)[1]
    return openai.OpenAI(
        base_url=live_server.url + "/v1", api_key=key, default_headers=USER, max_retries=0
    )


def _facts(owner) -> list[str]:
    row = scope_find(owner=owner, scope=("user", "alice"))
    return [] if row is None else sorted(v.content for v in fact_list(scope=row))


def _sent(server) -> list[dict]:
    return [r["json"] for r in server.requests if r["path"].endswith("/chat/completions")]


def test_the_proxy_runs_memory_tools_then_answers(live_server, alice, llm_settings, openai_server):
    openai_server.push(
        _calls(("manage_memory", {"content": "User likes jazz"})),
        _calls(("search_memory", {"query": "music"})),
        Scripted(body=chat_body("Noted: you like jazz.")),
    )
    answer = _client(live_server, alice).chat.completions.create(
        model="fake-model", tools=[CLIENT_TOOL], extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Remember that I like jazz."}],
    )  # fmt: skip
    assert answer.choices[0].message.content == "Noted: you like jazz."
    ran = answer.model_extra["memory_tool_calls"]
    assert [(r["name"], r["arguments"]) for r in ran] == [
        ("manage_memory", {"content": "User likes jazz"}), ("search_memory", {"query": "music"}),
    ]  # fmt: skip
    fact_id = ran[0]["result"]["id"]
    assert [h["id"] for h in ran[1]["result"]["results"]] == [fact_id]
    assert _facts(alice) == ["User likes jazz"]
    first, second, third = _sent(openai_server)
    assert [t["function"]["name"] for t in first["tools"]] == [
        "get_time", "manage_memory", "search_memory",
    ]  # fmt: skip
    assert all("memory_tools" not in body for body in (first, second, third))
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "manage_memory"
    assert second["messages"][-1]["role"] == "tool"
    assert json.loads(second["messages"][-1]["content"])["id"] == fact_id
    assert len(third["messages"]) == len(first["messages"]) + 4
    # The three rounds are counted as the proxy's tool loop, for the key's owner (issue 29).
    from core.models import UsageDay

    counted = UsageDay.objects.filter(owner=alice).values_list("kind", "calls", "tokens_in")
    assert list(counted) == [("tool_loop", 3, 30)]


def test_the_loop_is_bounded(live_server, alice, llm_settings, openai_server):
    llm_settings.CHAT_TOOL_MAX_ROUNDS = 2
    openai_server.chat_fn = lambda payload: _calls(("search_memory", {"query": "again"}))
    answer = _client(live_server, alice).chat.completions.create(
        model="fake-model", extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Loop forever"}],
    )  # fmt: skip
    first, last = _sent(openai_server)  # two model calls, no more
    assert "tools" in first and "tools" not in last  # the last call offers no memory tools
    assert answer.choices[0].message.tool_calls is None  # a stray memory call is not passed on
    assert answer.choices[0].finish_reason == "stop"
    assert len(answer.model_extra["memory_tool_calls"]) == 2


def test_a_failed_tool_call_goes_back_to_the_model(live_server, alice, llm_settings, openai_server):
    openai_server.push(
        _calls(("manage_memory", {"action": "delete"})),
        Scripted(body=chat_body("Sorry, I could not.")),
    )
    answer = _client(live_server, alice).chat.completions.create(
        model="fake-model", extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Forget it"}],
    )  # fmt: skip
    error = "id is required to delete a memory; call search_memory to find the id of the memory you mean"
    assert answer.model_extra["memory_tool_calls"][0]["error"] == error
    assert json.loads(_sent(openai_server)[1]["messages"][-1]["content"]) == {"error": error}
    assert Fact.objects.count() == 0


def test_streamed_answer_after_memory_tools(live_server, alice, llm_settings, openai_server):
    openai_server.push(
        _streamed_call("manage_memory", {"content": "User lives in Porto"}),
        _streamed_text("Got ", "it."),
    )
    stream = _client(live_server, alice).chat.completions.create(
        model="fake-model", stream=True, extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "I live in Porto now."}],
    )  # fmt: skip
    text, extra = "", None
    for chunk in stream:
        if chunk.choices:
            assert not chunk.choices[0].delta.tool_calls  # the memory call never reaches the client
            text += chunk.choices[0].delta.content or ""
        else:
            extra = chunk.model_extra
    assert text == "Got it."
    assert [r["name"] for r in extra["memory_tool_calls"]] == ["manage_memory"]
    assert "memories" in extra
    assert _facts(alice) == ["User lives in Porto"]
    assert len(_sent(openai_server)) == 2


def test_opt_in_needs_an_end_user_and_the_owners_setting_turns_it_on(
    live_server, alice, bob, llm_settings, openai_server
):
    key = api_key_create(owner=alice)[1]
    refused = httpx.post(
        timeout=30,
        url=live_server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "memory_tools": True},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("memory_tools: needs an end user")
    assert _sent(openai_server) == []
    bad = httpx.post(
        timeout=30,
        url=live_server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "memory_tools": "yes"},
        headers={"Authorization": f"Bearer {key}", **USER},
    )
    assert bad.status_code == 400 and _sent(openai_server) == []
    engine_settings_update(owner=bob, memory_tools=True)  # another owner's: not alice's
    openai_server.push(Scripted(body=chat_body("Hello.")))
    _client(live_server, alice).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "Hi"}]
    )
    assert "tools" not in _sent(openai_server)[0]
    openai_server.requests.clear()
    engine_settings_update(owner=alice, memory_tools=True)  # the owner's chats: on
    openai_server.push(Scripted(body=chat_body("Hello.")))
    _client(live_server, alice).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "Hi"}]
    )
    assert [t["function"]["name"] for t in _sent(openai_server)[0]["tools"]] == [
        "manage_memory", "search_memory",
    ]  # fmt: skip
    openai_server.push(Scripted(body=chat_body("Hello.")))
    _client(live_server, alice).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "Hi"}],
        extra_body={"memory_tools": False},
    )  # fmt: skip
    assert "tools" not in _sent(openai_server)[1]


def _streamed_calls(*calls: tuple[str, dict]) -> Scripted:
    base = {"id": "c3", "object": "chat.completion.chunk", "created": 3, "model": "m"}
    chunks = [
        {**base, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": i, "id": f"call_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}]}}]}
        for i, (name, arguments) in enumerate(calls)
    ]  # fmt: skip
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return Scripted(stream_chunks=chunks)


def _read(stream) -> tuple[list, list, dict]:
    calls, finishes, extra = [], [], None
    for chunk in stream:
        if not chunk.choices:
            extra = chunk.model_extra
            continue
        calls += [c.function.name for c in chunk.choices[0].delta.tool_calls or [] if c.function]
        finishes += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
    return calls, finishes, extra


def test_streamed_stray_memory_call_in_the_last_round_stops(
    live_server, alice, llm_settings, openai_server
):
    llm_settings.CHAT_TOOL_MAX_ROUNDS = 2
    openai_server.push(
        _streamed_calls(("search_memory", {"query": "first"})),
        _streamed_calls(("search_memory", {"query": "stray"})),  # not offered, called anyway
    )
    stream = _client(live_server, alice).chat.completions.create(
        model="fake-model", stream=True, extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Loop forever"}],
    )  # fmt: skip
    calls, finishes, extra = _read(stream)
    assert (calls, finishes) == ([], ["stop"])  # no call for the client: the turn stops
    assert [r["arguments"] for r in extra["memory_tool_calls"]] == [
        {"query": "first"},
        {"query": "stray"},
    ]  # fmt: skip  (the same as a JSON answer reports)
    assert "tools" not in _sent(openai_server)[1]


def test_streamed_client_call_beside_a_memory_call_runs_both(
    live_server, alice, llm_settings, openai_server
):
    openai_server.push(
        _streamed_calls(("manage_memory", {"content": "User likes tea"}), ("get_time", {}))
    )
    stream = _client(live_server, alice).chat.completions.create(
        model="fake-model", stream=True, tools=[CLIENT_TOOL], extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Remember I like tea; what time is it?"}],
    )  # fmt: skip
    calls, finishes, extra = _read(stream)
    assert (calls, finishes) == (["get_time"], ["tool_calls"])  # the client's call, unchanged
    assert [(r["name"], r["result"]["action"]) for r in extra["memory_tool_calls"]] == [
        ("manage_memory", "created")
    ]
    assert _facts(alice) == ["User likes tea"]
    assert len(_sent(openai_server)) == 1


def test_client_call_beside_a_memory_call_runs_both(
    live_server, alice, llm_settings, openai_server
):
    """Not streamed, taking the memory call out of the answer took every call after it
    too: the client's own call was lost (``tool_calls: []``)."""
    openai_server.push(_calls(("manage_memory", {"content": "User likes tea"}), ("get_time", {})))
    answer = _client(live_server, alice).chat.completions.create(
        model="fake-model", tools=[CLIENT_TOOL], extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Remember I like tea; what time is it?"}],
    )  # fmt: skip
    choice = answer.choices[0]
    assert [(c.id, c.function.name) for c in choice.message.tool_calls] == [("call_1", "get_time")]
    assert choice.finish_reason == "tool_calls"
    assert [
        (r["name"], r["result"]["action"]) for r in answer.model_extra["memory_tool_calls"]
    ] == [("manage_memory", "created")]
    assert _facts(alice) == ["User likes tea"]
    assert len(_sent(openai_server)) == 1


def _streamed_text_then_call(text: str, name: str, arguments: dict) -> Scripted:
    """A round that writes text, then calls a memory tool (as models often do)."""
    base = {"id": "c4", "object": "chat.completion.chunk", "created": 4, "model": "m"}
    deltas = [
        {"role": "assistant", "content": ""},
        {"content": text},
        {"tool_calls": [{"index": 0, "id": "call_t", "type": "function",
                         "function": {"name": name, "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(arguments)}}]},
    ]  # fmt: skip
    chunks = [
        {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    chunks.append({**base, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 5,
                                                    "total_tokens": 10}})  # fmt: skip
    return Scripted(stream_chunks=chunks)


def _read_text(stream) -> tuple[str, list, list, dict]:
    """A stream's text, finish reasons, usage chunks and memories chunk; no tool call
    reaches the client."""
    text, finishes, usage, extra = "", [], [], {}
    for chunk in stream:
        if chunk.choices:
            assert not chunk.choices[0].delta.tool_calls
            text += chunk.choices[0].delta.content or ""
            finishes += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
        elif "memories" in chunk.model_extra:
            extra = chunk.model_extra
        else:
            usage.append(chunk.usage)
    return text, finishes, usage, extra


def test_streamed_text_before_a_memory_call_goes_on_as_in_json(
    live_server, alice, llm_settings, openai_server
):
    """The model writes a few words, then calls manage_memory: the loop goes on (the
    model reads the result and answers), streamed as in a JSON answer. The words are
    already with the client; the next round's text follows in the same message, and the
    first round's closing chunks (finish tool_calls, usage) are not sent."""
    openai_server.push(
        _streamed_text_then_call(
            "Let me note that. ", "manage_memory", {"content": "User likes jazz"}
        ),
        _streamed_text("Noted: ", "you like jazz."),
    )
    stream = _client(live_server, alice).chat.completions.create(
        model="fake-model", stream=True, extra_body={"memory_tools": True},
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Remember that I like jazz."}],
    )  # fmt: skip
    text, finishes, usage, extra = _read_text(stream)
    assert text == "Let me note that. Noted: you like jazz."
    assert finishes == ["stop"] and usage == []  # round 1's finish and usage held back
    ran = extra["memory_tool_calls"]
    assert [(r["name"], r["arguments"], r["result"]["action"]) for r in ran] == [
        ("manage_memory", {"content": "User likes jazz"}, "created")
    ]
    assert _facts(alice) == ["User likes jazz"]
    first, second = _sent(openai_server)  # the model was called again, with the result
    asked, result = second["messages"][-2:]
    assert asked["content"] == "Let me note that. "
    assert [c["function"]["name"] for c in asked["tool_calls"]] == ["manage_memory"]
    assert (
        result["role"] == "tool" and json.loads(result["content"])["id"] == ran[0]["result"]["id"]
    )
    assert [t["function"]["name"] for t in second["tools"]] == ["manage_memory", "search_memory"]

    # The same turn in JSON: the same calls, the model called as often.
    openai_server.requests.clear()
    asked_json = chat_body("Let me note that. ")
    asked_json["choices"][0]["message"]["tool_calls"] = [{"id": "call_t", "type": "function",
        "function": {"name": "manage_memory", "arguments": '{"content": "User likes rock"}'}}]  # fmt: skip
    asked_json["choices"][0]["finish_reason"] = "tool_calls"
    openai_server.push(Scripted(body=asked_json), Scripted(body=chat_body("Noted: rock.")))
    answer = _client(live_server, alice).chat.completions.create(
        model="fake-model", extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Remember that I like rock."}],
    )  # fmt: skip
    assert answer.choices[0].message.content == "Noted: rock."
    assert len(_sent(openai_server)) == 2
    assert _sent(openai_server)[1]["messages"][-2]["content"] == "Let me note that. "


def test_streamed_rounds_of_text_and_memory_calls_are_bounded(
    live_server, alice, llm_settings, openai_server
):
    llm_settings.CHAT_TOOL_MAX_ROUNDS = 2
    openai_server.chat_fn = lambda payload: _streamed_text_then_call(
        "Checking. ", "search_memory", {"query": "again"}
    )
    stream = _client(live_server, alice).chat.completions.create(
        model="fake-model", stream=True, extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "Loop forever"}],
    )  # fmt: skip
    text, finishes, _, extra = _read_text(stream)
    first, last = _sent(openai_server)  # two model calls, no more
    assert "tools" in first and "tools" not in last  # the last offers no memory tools
    assert text == "Checking. Checking. " and finishes == ["stop"]
    assert [r["arguments"] for r in extra["memory_tool_calls"]] == [{"query": "again"}] * 2


def test_text_that_comes_with_a_memory_rounds_finish_still_reaches_the_client(
    live_server, alice, llm_settings, openai_server
):
    base = {"id": "c5", "object": "chat.completion.chunk", "created": 5, "model": "m"}
    call = {
        "index": 0,
        "id": "call_f",
        "type": "function",
        "function": {"name": "manage_memory", "arguments": '{"content": "User likes tea"}'},
    }
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "Saved. "},
                              "finish_reason": "tool_calls"}]},
    ]  # fmt: skip
    openai_server.push(Scripted(stream_chunks=chunks), _streamed_text("Tea it is."))
    stream = _client(live_server, alice).chat.completions.create(
        model="fake-model", stream=True, extra_body={"memory_tools": True},
        messages=[{"role": "user", "content": "I like tea."}],
    )  # fmt: skip
    text, finishes, _, extra = _read_text(stream)
    assert (text, finishes) == ("Saved. Tea it is.", ["stop"])  # round 1's finish left out
    assert [r["result"]["action"] for r in extra["memory_tool_calls"]] == ["created"]
    assert len(_sent(openai_server)) == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_whose_later_round_fails_teaches_nothing(
    live_server, alice, llm_settings, openai_server, stream
):
    """A new user's audit: the memory tools ran in round one, round two failed (a 502 to
    the client), and the turn was queued for learning all the same: "a failed request
    writes no memory". What the model's tool call wrote stays (it was done, and is in
    the journal of that call); the message itself teaches nothing."""
    from memories.engine.models import PendingUpdate

    llm_settings.LLM_MAX_RETRIES = 0
    first = _streamed_call("manage_memory", {"content": "User likes jazz"}) if stream else _calls(
        ("manage_memory", {"content": "User likes jazz"}))  # fmt: skip
    openai_server.push(first, *[Scripted(status=500, body={"error": "down"})] * 4)
    key = api_key_create(owner=alice)[1]
    answer = httpx.post(
        live_server.url + "/v1/chat/completions", timeout=30,
        headers={"Authorization": f"Bearer {key}", **USER},
        json={"model": "fake-model", "memory_tools": True, "stream": stream,
              "messages": [{"role": "user", "content": "I like jazz, remember it."}]},
    )  # fmt: skip
    assert answer.status_code == 502, answer.text
    assert _facts(alice) == ["User likes jazz"]  # (the tool call's own write)
    assert not PendingUpdate.objects.exists()


@pytest.mark.parametrize("opt_in", [True, None])  # (None: the owner's setting turns it on)
def test_client_tools_that_are_not_a_list_are_refused_not_replaced(
    live_server, alice, llm_settings, openai_server, opt_in
):
    """``"tools": "x"`` with the memory tools on was replaced by the memory tools and
    answered 200 (without them it goes upstream as sent): a 400 naming ``tools``, before
    the upstream is asked or an end user made."""
    from memories.facts.models import Scope

    if opt_in is None:
        engine_settings_update(owner=alice, memory_tools=True)
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": "x"}
    if opt_in:
        body["memory_tools"] = True
    key = api_key_create(owner=alice)[1]
    refused = httpx.post(timeout=30, url=live_server.url + "/v1/chat/completions", json=body,
                         headers={"Authorization": f"Bearer {key}", **USER})  # fmt: skip
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["param"], error["message"]) == (
        "tools", "tools: must be a list of tools; the memory tools are offered beside them"
    )  # fmt: skip
    assert _sent(openai_server) == [] and not Scope.objects.filter(owner=alice).exists()


def _nullable_as_json_schema(node):
    """OpenAPI 3.0's ``nullable`` as JSON Schema says it (``type: [t, "null"]``)."""
    if isinstance(node, dict):
        node = {k: _nullable_as_json_schema(v) for k, v in node.items()}
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        return node
    if isinstance(node, list):
        return [_nullable_as_json_schema(v) for v in node]
    return node


def test_a_json_answer_is_what_the_schema_says(live_server, alice, llm_settings, openai_server):
    """The schema said only "an object": it now names ``memories`` and
    ``memory_tool_calls`` (a call that ran, one whose arguments were no JSON), checked
    here against the served schema with answers that hold both kinds of memory."""
    import jsonschema
    from drf_spectacular.generators import SchemaGenerator

    from memories.facts.scopes import end_user_ensure
    from tests.memories.facts.seed import seed

    schema = SchemaGenerator().get_schema(request=None, public=True)
    operation = schema["paths"]["/v1/chat/completions"]["post"]
    answer_schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator(_nullable_as_json_schema(answer_schema))
    seed(end_user_ensure(owner=alice, external_id="alice"), "User likes jazz", "User has a cat")
    bad = _calls(("search_memory", {"query": "music"}))
    bad.body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "{not json"
    openai_server.push(
        _calls(("search_memory", {"query": "music"})), bad, Scripted(body=chat_body("Jazz."))
    )
    key = api_key_create(owner=alice)[1]
    got = httpx.post(timeout=30, url=live_server.url + "/v1/chat/completions",
                     json={"messages": [{"role": "user", "content": "What music do I like?"}],
                           "memory_tools": True},
                     headers={"Authorization": f"Bearer {key}", **USER})  # fmt: skip
    assert got.status_code == 200, got.text
    body = got.json()
    validator.validate(body)
    assert {m["relevant"] for m in body["memories"]} == {True, False}
    assert [("error" in c, c["arguments"]) for c in body["memory_tool_calls"]] == [
        (False, {"query": "music"}), (True, "{not json")
    ]  # fmt: skip
    openai_server.push(Scripted(body=chat_body("Hello.")))
    anonymous = httpx.post(timeout=30, url=live_server.url + "/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "Hi"}]},
                           headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    assert anonymous.status_code == 200
    validator.validate(anonymous.json())
