"""The chat proxy as OpenAI-compatible clients use it: /v1/models, tool calls passed
through both ways (what the fake upstream receives and what the client receives are
compared), Open WebUI's headers, memories reported in streams; driven by the official
``openai`` package (sync, async, streaming) and LangChain's ChatOpenAI."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from core.services import api_key_create
from memories.proxy.chat import MEMORY_BLOCK_HEADER
from memories.tools.callables import memory_tools
from tests.fakes.openai_server import Scripted, chat_body, chat_chunks

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
}
# A conversation in the middle of a tool call: the assistant asked, the tool answered.
TOOL_TURN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Lisbon?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear", "c": 21}'},
]


def _key(owner) -> str:
    return api_key_create(owner=owner)[1]


def _headers(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **extra}


def _tool_call_answer() -> dict:
    body = chat_body("")
    body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["system_fingerprint"] = "fp_vendor"  # a field the proxy knows nothing about
    return body


def _tool_call_chunks() -> list[dict]:
    base = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    deltas = [
        {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Lisbon"}'}}]},
    ]  # fmt: skip
    chunks = [
        {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return chunks


# --- /v1/models ---------------------------------------------------------------------
def test_models_passes_the_upstream_list_through(live_server, alice, llm_settings, openai_server):
    listed = {"object": "list", "data": [
        {"id": "llama3.2", "object": "model", "created": 1, "owned_by": "ollama"},
        {"id": "qwen3", "object": "model", "created": 2, "owned_by": "ollama", "extra": 1},
    ]}  # fmt: skip
    openai_server.models = listed
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key=_key(alice), max_retries=0)
    assert [m.id for m in client.models.list()] == ["llama3.2", "qwen3"]
    raw = httpx.get(timeout=30, url=live_server.url + "/v1/models", headers=_headers(_key(alice)))
    assert raw.json() == listed
    assert httpx.get(timeout=30, url=live_server.url + "/v1/models").status_code == 401


def test_models_falls_back_to_the_configured_list(live_server, alice, llm_settings, openai_server):
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key=_key(alice), max_retries=0)
    assert [m.id for m in client.models.list()] == ["fake-model"]  # upstream 404: LLM_MODEL
    openai_server.models = {"object": "list", "data": []}  # an empty list: the same
    assert [m.id for m in client.models.list()] == ["fake-model"]
    llm_settings.LLM_MODEL = ""  # no model configured either: an empty list, not [""]
    assert [m.id for m in client.models.list()] == []


# --- tool calls pass through --------------------------------------------------------
def _seed(owner, user_id="alice"):
    manage, _ = memory_tools(owner=owner, scope=["user", user_id])
    manage("User lives in Lisbon")


def _compact(value) -> bytes:
    """JSON as many servers and clients write it: no spaces, non-ASCII as raw UTF-8."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


# Accents, an emoji, escapes (a quote, a newline, a \u escape kept as written), spaces in
# odd places: what an exact relay must keep.
ASKED = (
    '{"model":"fake-model","messages":[{"role":"system","content":"Sois bref, réponds en '
    'français \\u00e9 \\"ok\\"."},{"role":"user","content":"Quel temps à Lisbonne ? 🌤"},'
    '{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",'
    '"function":{"name":"get_weather","arguments":"{\\"city\\":\\"Lisbonne\\"}"}}]},'
    '{"role":"tool","tool_call_id":"call_1","content":"{\\"ciel\\":\\"dégagé\\"}"}],'
    '"tools":%s,  "tool_choice" : "auto","seed":7,"vendor_option":{"x":[1,2.50,1e3]}%s}'
)


def _asked(*, stream: bool = False) -> bytes:
    tail = ',"stream":true,"stream_options":{"include_usage":true}' if stream else ""
    return (ASKED % (_compact(TOOLS).decode(), tail)).encode()


def _forwarded(upstream: dict, asked: bytes) -> None:
    """The upstream got the client's bytes with only the memory block spliced in, at the
    end of the system message's text (escaped as JSON writes it, UTF-8 kept)."""
    system = json.loads(upstream["raw"])["messages"][0]["content"]
    block = system[system.index("\n\n" + MEMORY_BLOCK_HEADER) :]
    assert "User lives in Lisbon" in block
    spliced = json.dumps(block, ensure_ascii=False)[1:-1].encode()
    end_of_system = asked.index(b'."},{"role":"user"') + 1  # its closing quote
    assert upstream["raw"] == asked[:end_of_system] + spliced + asked[end_of_system:]


def _chat_posts(server) -> list[dict]:
    return [r for r in server.requests if r["path"].endswith("/chat/completions")]


def test_tool_call_conversation_passes_through_byte_for_byte(
    live_server, alice, llm_settings, openai_server
):
    _seed(alice)
    answer = _tool_call_answer()
    answer["choices"][0]["message"]["content"] = "Je regarde… 🌤"
    scripted = Scripted(body=answer, compact=True)
    openai_server.push(scripted)
    asked = _asked()
    received = httpx.post(
        timeout=30,
        url=live_server.url + "/v1/chat/completions",
        content=asked,
        headers=_headers(_key(alice), **{"X-OpenWebUI-User-Id": "alice"}),
    )
    assert received.status_code == 200
    (upstream,) = _chat_posts(openai_server)
    _forwarded(upstream, asked)
    sent = scripted.encode(answer)  # the upstream's bytes
    memories = json.loads(received.content)["memories"]
    assert [m["content"] for m in memories] == ["User lives in Lisbon"]
    # Byte for byte, plus one top-level member before the closing brace.
    assert received.content == sent[:-1] + b',"memories":' + _compact(memories) + b"}"


def test_streamed_tool_call_deltas_pass_through_byte_for_byte(
    live_server, alice, llm_settings, openai_server
):
    _seed(alice)
    chunks = _tool_call_chunks()
    chunks[0]["choices"][0]["delta"]["content"] = "Un instant… 🌤"
    chunks.append({**{k: chunks[0][k] for k in ("id", "object", "created", "model")},
                   "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3,
                                            "total_tokens": 12}})  # fmt: skip
    scripted = Scripted(stream_chunks=chunks, compact=True, split=7)  # events cut mid-way
    openai_server.push(scripted)
    asked = _asked(stream=True)
    with httpx.stream(
        "POST",
        live_server.url + "/v1/chat/completions",
        timeout=30,
        content=asked,
        headers=_headers(_key(alice), **{"X-OpenWebUI-User-Id": "alice"}),
    ) as answer:
        body = b"".join(answer.iter_bytes())
    (upstream,) = _chat_posts(openai_server)
    _forwarded(upstream, asked)
    relayed = b"".join(scripted.event(c) for c in chunks)  # as the upstream wrote them
    assert body.startswith(relayed)
    last, done = body[len(relayed) :].split(b"\n\n", 1)
    memories = json.loads(last.removeprefix(b"data: "))
    assert memories["choices"] == [] and memories["id"] == "chatcmpl-t"
    assert [m["content"] for m in memories["memories"]] == ["User lives in Lisbon"]
    assert done == b"data: [DONE]\n\n"


def test_a_request_without_a_system_message_gets_one_in_front(
    live_server, alice, llm_settings, openai_server
):
    _seed(alice)
    openai_server.push(Scripted(body=chat_body("Oui.")))
    asked = '{"messages":[{"role":"user","content":"Où est-ce que j\'habite ?"}],"model":"m"}'
    httpx.post(
        timeout=30, url=live_server.url + "/v1/chat/completions", content=asked.encode(),
        headers=_headers(_key(alice), **{"X-OpenWebUI-User-Id": "alice"}),
    ).raise_for_status()  # fmt: skip
    (upstream,) = _chat_posts(openai_server)
    system = json.loads(upstream["raw"])["messages"][0]
    assert system["role"] == "system" and "User lives in Lisbon" in system["content"]
    front = _compact(system) + b","
    assert upstream["raw"] == asked.encode().replace(b'"messages":[', b'"messages":[' + front)


def test_sse_framing_survives_the_relay(live_server, alice, llm_settings, openai_server):
    """CRLF line ends, a comment, a two-line data field, events cut in three-byte reads:
    the client gets the same bytes, and the openai client reads them."""
    chunks = chat_chunks(["Olá, ", "tudo bem?"])
    events = [
        b": keep-alive\r\n\r\n",
        b"data: " + _compact(chunks[0]) + b"\r\n\r\n",
        b'data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1700000000,\r\n'
        b'data: "model":"fake-model","choices":[{"index":0,"delta":{"content":"tudo bem?"},'
        b'"finish_reason":null}]}\r\n\r\n',
        b"data: " + _compact(chunks[2]) + b"\r\n\r\n",
        b"data: [DONE]\r\n\r\n",
    ]
    openai_server.push(Scripted(stream_chunks=events, split=3, done=False))
    key = _key(alice)
    raw = httpx.post(timeout=30, url=live_server.url + "/v1/chat/completions",
                     json={"model": "m", "stream": True,
                           "messages": [{"role": "user", "content": "Oi"}]},
                     headers=_headers(key))  # fmt: skip
    assert raw.content == b"".join(events)  # anonymous: nothing added, [DONE] as it came
    openai_server.push(Scripted(stream_chunks=events, split=3, done=False))
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key=key, max_retries=0)
    stream = client.chat.completions.create(
        model="m", stream=True, messages=[{"role": "user", "content": "Oi"}]
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "Olá, tudo bem?"


def test_anonymous_stream_has_no_memories_event(live_server, alice, llm_settings, openai_server):
    chunks = _tool_call_chunks()
    openai_server.push(Scripted(stream_chunks=chunks, compact=True))
    sent = {"model": "fake-model", "messages": TOOL_TURN[:2], "tools": TOOLS, "stream": True}
    answer = httpx.post(timeout=30, url=
        live_server.url + "/v1/chat/completions", content=_compact(sent),
        headers=_headers(_key(alice)),
    )  # fmt: skip
    expected = b"".join(b"data: " + _compact(c) + b"\n\n" for c in chunks)
    assert answer.content == expected + b"data: [DONE]\n\n"
    assert openai_server.requests[0]["raw"] == _compact(sent)


def test_openai_client_sync_async_and_streaming_with_tools(
    live_server, alice, llm_settings, openai_server
):
    _seed(alice)
    key = _key(alice)
    headers = {"X-OpenWebUI-User-Id": "alice"}
    url = live_server.url + "/v1"
    openai_server.push(Scripted(body=_tool_call_answer()))
    sync = openai.OpenAI(base_url=url, api_key=key, default_headers=headers, max_retries=0)
    done = sync.chat.completions.create(model="fake-model", messages=TOOL_TURN[:2], tools=TOOLS)
    call = done.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_1", "get_weather", {"city": "Lisbon"},
    )  # fmt: skip
    assert [m["content"] for m in done.model_extra["memories"]] == ["User lives in Lisbon"]

    openai_server.push(Scripted(stream_chunks=_tool_call_chunks()))
    stream = sync.chat.completions.create(
        model="fake-model", messages=TOOL_TURN[:2], tools=TOOLS, stream=True
    )
    arguments, memories = "", None
    for chunk in stream:
        if chunk.choices:
            for delta in chunk.choices[0].delta.tool_calls or []:
                arguments += delta.function.arguments or ""
        else:
            memories = chunk.model_extra["memories"]
    assert json.loads(arguments) == {"city": "Lisbon"}
    assert [m["content"] for m in memories] == ["User lives in Lisbon"]

    openai_server.push(Scripted(body=chat_body("It is clear and 21 C.")))

    async def follow_up() -> str:
        client = openai.AsyncOpenAI(
            base_url=url, api_key=key, default_headers=headers, max_retries=0
        )
        answer = await client.chat.completions.create(
            model="fake-model", messages=TOOL_TURN, tools=TOOLS
        )
        await client.close()
        return answer.choices[0].message.content

    assert asyncio.run(follow_up()) == "It is clear and 21 C."
    last = [r for r in openai_server.requests if r["path"].endswith("/chat/completions")][-1]
    assert last["json"]["messages"][2:] == TOOL_TURN[2:]  # tool_calls and tool result intact


def test_langchain_chat_openai_bind_tools(live_server, alice, llm_settings, openai_server):
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    openai_server.push(Scripted(body=_tool_call_answer()), Scripted(body=chat_body("Sunny.")))
    model = ChatOpenAI(
        model="fake-model", base_url=live_server.url + "/v1", api_key=_key(alice),
        default_headers={"X-OpenWebUI-User-Id": "alice"}, max_retries=0,
    ).bind_tools(TOOLS)  # fmt: skip
    first = model.invoke("What is the weather in Lisbon?")
    assert isinstance(first, AIMessage)
    assert first.tool_calls == [
        {"name": "get_weather", "args": {"city": "Lisbon"}, "id": "call_1", "type": "tool_call"}
    ]
    second = model.invoke(
        ["What is the weather in Lisbon?", first,
         ToolMessage(content='{"sky": "clear"}', tool_call_id="call_1")]
    )  # fmt: skip
    assert second.content == "Sunny."
    sent = [r["json"] for r in openai_server.requests if r["path"].endswith("/chat/completions")]
    assert sent[0]["tools"] == TOOLS
    assert sent[1]["messages"][-2]["tool_calls"][0]["id"] == "call_1"
    assert sent[1]["messages"][-1] == {
        "role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "call_1",
    }  # fmt: skip


# --- Open WebUI's headers -----------------------------------------------------------
def test_open_webui_chat_id_becomes_a_conversation(live_server, alice, llm_settings, openai_server):
    from memories.conversations.models import Flow

    openai_server.push(
        Scripted(body=chat_body("Hello Alice.")),
        Scripted(stream_chunks=[
            {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
            for p in ("Tea ", "it is.")
        ]),
    )  # fmt: skip
    chat = "5f2b8a53-1e1f-4bd4-a1c1-5f7d0e9c2a11"
    headers = {
        "X-OpenWebUI-User-Id": "0c9d8f9e-user", "X-OpenWebUI-User-Name": "Alice",
        "X-OpenWebUI-User-Email": "alice@example.com", "X-OpenWebUI-Chat-Id": chat,
    }  # fmt: skip
    key = _key(alice)
    client = openai.OpenAI(
        base_url=live_server.url + "/v1", api_key=key, default_headers=headers, max_retries=0
    )
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "Hi"}])
    stream = client.chat.completions.create(
        model="fake-model", stream=True,
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello Alice."},
                  {"role": "user", "content": "Tea or coffee?"}],
    )  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Tea it is."
    flow = Flow.objects.get(owner=alice, name="chat-proxy")
    history = httpx.get(timeout=30, url=
        f"{live_server.url}/api/v1/conversations/{chat}/history",
        params={"flow": str(flow.pk)}, headers=_headers(key),
    ).json()  # fmt: skip
    assert [(m["role"], m["content"]) for m in history["messages"]] == [
        ("user", "Hi"), ("assistant", "Hello Alice."),
        ("user", "Tea or coffee?"), ("assistant", "Tea it is."),
    ]  # fmt: skip
    from memories.conversations.models import Message

    user_message = Message.objects.filter(role="user").first()
    assert (user_message.sender, user_message.sender_name) == (
        "0c9d8f9e-user", "Alice <alice@example.com>",
    )  # fmt: skip


def test_a_memory_base_on_the_proxys_flow_captures_its_chats(
    live_server, alice, llm_settings, openai_server, settings
):
    """The proxy stored its turns without the capture's trigger: a memory base on the
    ``chat-proxy`` flow never learned a chat on its own (its threshold was never checked)."""
    from memories.bases.models import MemoryBaseJob
    from memories.bases.services import memory_base_create
    from memories.conversations.services import flow_ensure

    flow = flow_ensure(owner_id=alice.pk, name=settings.CHAT_PROXY_FLOW)
    memory_base = memory_base_create(owner=alice, name="chats", flow=flow, threshold=1)
    openai_server.push(Scripted(body=chat_body("Tea it is.")))
    key = _key(alice)
    client = openai.OpenAI(
        base_url=live_server.url + "/v1", api_key=key, max_retries=0,
        default_headers={"X-OpenWebUI-User-Id": "wes", "X-OpenWebUI-Chat-Id": "wes-1"},
    )  # fmt: skip
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "Tea or coffee?"}]
    )
    job = MemoryBaseJob.objects.get(memory_base=memory_base)
    assert (job.trigger, job.session.session_id) == ("auto", "wes-1")
    texts = list(memory_base.knowledge_base.chunks.values_list("text", flat=True))
    assert texts == ["Tea it is."]


def test_a_bad_chat_id_is_a_400_and_nothing_is_sent(
    live_server, alice, llm_settings, openai_server
):
    answer = httpx.post(
        timeout=30,
        url=live_server.url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}]},
        headers=_headers(_key(alice), **{"X-OpenWebUI-Chat-Id": "a b"}),
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"
    # It names the header the client sent, not a session_id it never sent.
    message = answer.json()["error"]["message"]
    assert message.startswith("X-OpenWebUI-Chat-Id: must be 1-255") and "session_id" not in message
    assert openai_server.requests == []


def test_erasing_the_user_erases_their_recorded_chats(
    live_server, alice, llm_settings, openai_server
):
    from memories.conversations.models import Message

    key = _key(alice)
    for user, chat in (("u1", "chat-of-u1"), ("u2", "chat-of-u2")):
        openai_server.push(Scripted(body=chat_body("Hello.")))
        httpx.post(
            timeout=30,
            url=live_server.url + "/v1/chat/completions",
            json={"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}]},
            headers=_headers(key, **{"X-OpenWebUI-User-Id": user, "X-OpenWebUI-Chat-Id": chat}),
        ).raise_for_status()
    assert sorted(set(Message.objects.values_list("session_id", flat=True))) == [
        "chat-of-u1", "chat-of-u2",
    ]  # fmt: skip
    erased = httpx.delete(
        timeout=30, url=f"{live_server.url}/api/v1/users/u1/memories", headers=_headers(key)
    )
    assert erased.status_code == 200
    assert sorted(set(Message.objects.values_list("session_id", flat=True))) == ["chat-of-u2"]


def test_stream_false_as_a_string_is_refused_as_openai_does(
    live_server, alice, llm_settings, openai_server
):
    # OpenAI answers 400 "expected a boolean, but got a string"; so does the proxy, before any upstream call.
    answer = httpx.post(timeout=30, url=
        live_server.url + "/v1/chat/completions",
        json={"model": "fake-model", "stream": "false",
              "messages": [{"role": "user", "content": "Hi"}]},
        headers=_headers(_key(alice)),
    )  # fmt: skip
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "stream")
    assert openai_server.requests == []


def test_summaries_of_a_chat_the_proxy_recorded(live_server, alice, llm_settings, openai_server):
    """The chat id is the conversation for summaries too: the engine's summaries endpoint
    and the history's strategy=summarize fold a chat recorded by the proxy (the scripted
    LLM writes the summary) and share its running summary. A turn that went through a
    tool call is recorded as the user saw it: the question, then the final answer."""
    from memories.conversations.models import ConversationSummary, Flow, Message

    chat = "5f2b8a53-1e1f-4bd4-a1c1-5f7d0e9c2a12"
    headers = {"X-OpenWebUI-User-Id": "alice", "X-OpenWebUI-Chat-Id": chat}
    key = _key(alice)
    client = openai.OpenAI(
        base_url=live_server.url + "/v1", api_key=key, default_headers=headers, max_retries=0
    )
    openai_server.push(
        Scripted(body=chat_body("Welcome to Lisbon!")),
        Scripted(body=_tool_call_answer()),  # the weather: a tool call, no text yet
        Scripted(body=chat_body("It is clear and 21 C.")),  # after the tool's result
        Scripted(body=chat_body("Carcavelos is close by train.")),
    )
    said = [{"role": "user", "content": "I moved to Lisbon in May."}]
    client.chat.completions.create(model="fake-model", messages=said)
    said += [{"role": "assistant", "content": "Welcome to Lisbon!"}, TOOL_TURN[1]]
    client.chat.completions.create(model="fake-model", messages=said, tools=TOOLS)
    said += TOOL_TURN[2:]
    client.chat.completions.create(model="fake-model", messages=said, tools=TOOLS)
    said += [{"role": "assistant", "content": "It is clear and 21 C."},
             {"role": "user", "content": "Which beach is closest?"}]  # fmt: skip
    client.chat.completions.create(model="fake-model", messages=said, tools=TOOLS)
    flow = Flow.objects.get(owner=alice, name="chat-proxy")
    recorded = httpx.get(timeout=30, url=
        f"{live_server.url}/api/v1/conversations/{chat}/history", headers=_headers(key),
        params={"flow": str(flow.pk)},
    ).json()["messages"]  # fmt: skip
    assert [(m["role"], m["content"]) for m in recorded] == [
        ("user", "I moved to Lisbon in May."), ("assistant", "Welcome to Lisbon!"),
        ("user", "What is the weather in Lisbon?"), ("assistant", "It is clear and 21 C."),
        ("user", "Which beach is closest?"), ("assistant", "Carcavelos is close by train."),
    ]  # fmt: skip

    summarised = "Alice moved to Lisbon in May; the weather there is clear."
    openai_server.requests.clear()
    openai_server.push(Scripted(body=chat_body(summarised)))
    answer = httpx.post(timeout=30, url=
        f"{live_server.url}/api/v1/engine/summaries", headers=_headers(key),
        json={"scope": ["user", "alice"], "max_tokens": 50, "max_summary_tokens": 20,
              "conversation": {"flow": str(flow.pk), "session_id": chat}},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    body = answer.json()
    kept = [
        {"role": "user", "content": "Which beach is closest?"},
        {"role": "assistant", "content": "Carcavelos is close by train."},
    ]
    assert body["llm_calls"] == 1 and body["token_count"] <= 50
    assert body["messages"] == [
        {"role": "system", "content": f"Summary of the earlier conversation:\n{summarised}"},
        *kept,
    ]
    (sent,) = [r["json"] for r in openai_server.requests]
    prompt = sent["messages"][-1]["content"]
    assert "I moved to Lisbon in May." in prompt and "It is clear and 21 C." in prompt
    assert "Which beach" not in prompt
    ids = (
        Message.objects.filter(session_id=chat)
        .order_by("created_at", "id")
        .values_list("id", flat=True)
    )
    assert body["running_summary"]["summarized_message_ids"] == [str(i) for i in ids[:4]]
    assert ConversationSummary.objects.filter(owner=alice).count() == 1

    history = httpx.get(timeout=30, url=
        f"{live_server.url}/api/v1/conversations/{chat}/history", headers=_headers(key),
        params={"flow": str(flow.pk), "strategy": "summarize", "max_tokens": 50,
                "max_summary_tokens": 20},
    )  # fmt: skip
    assert history.status_code == 200, history.text
    assert [{"role": m["role"], "content": m["content"]} for m in history.json()["messages"]] == [
        {"role": "system", "content": f"Summary of the earlier conversation:\n{summarised}"},
        *kept,
    ]
    assert len(openai_server.requests) == 1  # the same running summary: no second fold


def test_an_error_event_from_the_upstream(live_server, alice, llm_settings, openai_server):
    """First in the stream it is a JSON error (nothing was sent yet); later it reaches
    the client as the upstream sent it, and the turn is not recorded."""
    from memories.conversations.models import Message

    headers = _headers(_key(alice), **{"X-OpenWebUI-User-Id": "alice",
                                       "X-OpenWebUI-Chat-Id": "chat-with-errors"})  # fmt: skip
    asked = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    url = live_server.url + "/v1/chat/completions"
    openai_server.push(Scripted(stream_chunks=[{"error": {"message": "overloaded"}}]))
    first = httpx.post(timeout=30, url=url, json=asked, headers=headers)
    assert (first.status_code, first.headers["content-type"]) == (502, "application/json")
    assert first.json()["error"]["message"] == "provider sent an error: overloaded"
    chunks = [chat_chunks(["Hel"])[0], {"error": {"message": "cut short"}}]
    scripted = Scripted(stream_chunks=chunks, compact=True)
    openai_server.push(scripted)
    later = httpx.post(timeout=30, url=url, json=asked, headers=headers)
    relayed = b"".join(scripted.event(c) for c in chunks)
    assert later.status_code == 200 and later.content.startswith(relayed)
    assert later.content.endswith(b"data: [DONE]\n\n")
    assert not Message.objects.exists()
