"""Door 3: the MCP server, driven by the official SDK's own client, over streamable
HTTP at /mcp (a live server) and over stdio (``manage.py mcp`` as a real process)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from django.conf import settings
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from core.services import api_key_create
from memories.engine import files
from memories.facts.models import Fact
from memories.tools.callables import memory_tools
from memories.tools.mcp_server import scope_uri
from memories.tools.registry import openai_tools

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]
SCOPE = ["user", "alice"]


async def _session(url: str, key: str, work: Any) -> Any:
    # The SDK's public way to send headers: its transport takes an httpx2 client.
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)


def _run(live_server, key: str, work: Any) -> Any:
    return asyncio.run(_session(live_server.url + "/mcp", key, work))


def _key(owner) -> str:
    return api_key_create(owner=owner)[1]


def test_tools_listed_with_the_same_schemas_plus_scope(live_server, alice):
    async def work(session: ClientSession) -> Any:
        return (await session.list_tools()).tools

    listed = {t.name: t for t in _run(live_server, _key(alice), work)}
    for entry in openai_tools():
        function = entry["function"]
        tool = listed[function["name"]]
        assert tool.description == function["description"]
        schema = dict(tool.input_schema)
        if function["name"] in ("manage_memory", "search_memory"):
            assert schema["properties"].pop("scope")["type"] == "array"
        assert schema == function["parameters"]
    assert listed["search_memory"].annotations.read_only_hint is True
    assert listed["manage_memory"].annotations.read_only_hint is False


def test_call_each_tool_errors_and_resources_over_http(live_server, alice, flow, engine_storage):
    key = _key(alice)
    config = {
        "memory": [{"name": "log", "type": "blackboard", "config": {"max_items": 5}}],
        "nodes": [{"id": "worker", "flow": flow.name, "memories": [{"name": "log"}]}],
    }
    assert httpx.post(timeout=30, url=
        live_server.url + "/api/v1/memory-config", json=config,
        headers={"Authorization": f"Bearer {key}"},
    ).status_code == 200  # fmt: skip
    day = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
    files.journal_append(owner_id=alice.pk, scope=SCOPE,
                         messages=[{"role": "user", "content": "I moved to Lisbon"}], at=day,
                         source="chat")  # fmt: skip

    async def work(session: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        created = await session.call_tool(
            "manage_memory", {"scope": SCOPE, "content": "User lives in Lisbon"}
        )
        out["created"] = (created.is_error, created.structured_content, created.content[0].text)
        found = await session.call_tool("search_memory", {"scope": SCOPE, "query": "Lisbon"})
        out["found"] = found.structured_content
        fact_id = found.structured_content["results"][0]["id"]
        out["updated"] = (await session.call_tool("manage_memory", {
            "scope": SCOPE, "action": "update", "id": fact_id, "content": "User lives in Porto",
        })).structured_content  # fmt: skip
        write = await session.call_tool("write_node_memory", {
            "flow": str(flow.pk), "node_id": "worker", "input": "step 1", "output": "done 1",
        })  # fmt: skip
        out["write"] = write.structured_content
        out["retrieve"] = (await session.call_tool("retrieve_node_memory", {
            "flow": str(flow.pk), "node_id": "worker", "query": "", "stage": "gen",
        })).structured_content  # fmt: skip
        missing = await session.call_tool(
            "manage_memory", {"scope": SCOPE, "action": "update", "content": "x"}
        )
        out["missing_id"] = (missing.is_error, missing.content[0].text)
        bad = await session.call_tool("search_memory", {"scope": SCOPE, "query": "x", "limit": 0})
        out["bad"] = (bad.is_error, bad.content[0].text)
        with pytest.raises(MCPError) as err:  # a protocol error, not a tool result (the spec)
            await session.call_tool("no_such_tool", {})
        out["unknown"] = (err.value.error.code, err.value.error.message, err.value.error.data)
        out["resources"] = [str(r.uri) for r in (await session.list_resources()).resources]
        out["memory_md"] = (await session.read_resource(scope_uri(SCOPE))).contents[0].text
        out["journal"] = (
            (await session.read_resource(scope_uri(SCOPE, day.date()))).contents[0].text
        )
        with pytest.raises(MCPError) as err:
            await session.read_resource("memory://scope/user,alice/OTHER.md")
        out["bad_uri"] = (err.value.error.code, err.value.error.message)
        out["deleted"] = (await session.call_tool("manage_memory", {
            "scope": SCOPE, "action": "delete", "id": fact_id,
        })).structured_content  # fmt: skip
        return out

    out = _run(live_server, key, work)
    fact_id = out["updated"]["id"]
    is_error, created, text = out["created"]
    assert not is_error and created["action"] == "created" and json.loads(text) == created
    assert [h["content"] for h in out["found"]["results"]] == ["User lives in Lisbon"]
    assert out["updated"] == {"action": "updated", "id": fact_id, "content": "User lives in Porto",
                              "message": f"Updated memory {fact_id}."}  # fmt: skip
    assert [r["action"] for r in out["write"]["results"]] == ["added"]
    assert [h["content"] for h in out["retrieve"]["stores"][0]["hits"]] == [
        "Input: step 1 Output: done 1"
    ]
    assert out["missing_id"] == (True, "id is required to update a memory; call search_memory "
                                 "to find the id of the memory you mean")  # fmt: skip
    assert out["bad"] == (True, "invalid arguments: limit: 0 is less than the minimum of 1")
    names = sorted(t["function"]["name"] for t in openai_tools())
    assert out["unknown"] == (
        -32602, f"there is no tool named 'no_such_tool'; the tools are: {', '.join(names)}",
        {"tools": names},
    )  # fmt: skip
    assert out["resources"] == [scope_uri(SCOPE)]
    assert out["memory_md"] == (
        f"# MEMORY · user/alice\n\n1 facts.\n\n## context\n\n"
        f"- [1.00] User lives in Porto (id: {fact_id})\n"
    )
    assert "- **user**: I moved to Lisbon" in out["journal"]
    assert out["bad_uri"] == (-32602, "Unknown resource: memory://scope/user,alice/OTHER.md")
    assert out["deleted"]["action"] == "deleted"
    assert Fact.objects.filter(links__scope__owner=alice).count() == 0


def test_another_owner_sees_nothing_and_a_wrong_key_is_refused(live_server, alice, bob):
    manage, _ = memory_tools(owner=alice, scope=SCOPE)
    fact_id = manage("User plays the violin")["id"]

    async def work(session: ClientSession) -> dict[str, Any]:
        found = await session.call_tool("search_memory", {"scope": SCOPE, "query": "violin"})
        delete = await session.call_tool(
            "manage_memory", {"scope": SCOPE, "action": "delete", "id": fact_id}
        )
        with pytest.raises(MCPError) as err:
            await session.read_resource(scope_uri(SCOPE))
        return {
            "found": found.structured_content["results"],
            "delete": (delete.is_error, delete.content[0].text),
            "resources": (await session.list_resources()).resources,
            "read": err.value.error.code,
        }

    out = _run(live_server, _key(bob), work)
    assert out["found"] == [] and out["resources"] == [] and out["read"] == -32602
    assert out["delete"] == (
        True,
        f"no memory with id {fact_id} in scope ['user', 'alice']; call search_memory to find "
        "the id of the memory you mean",
    )
    assert Fact.objects.filter(pk=fact_id).exists()
    with pytest.raises(BaseException) as err:  # an ExceptionGroup from the client's task group
        _run(live_server, "mem_wrong", work)
    raised = err.value
    while isinstance(raised, BaseExceptionGroup):
        raised = raised.exceptions[0]
    assert isinstance(raised, MCPError), repr(err.value)
    refused = httpx.post(timeout=30, url=live_server.url + "/mcp", json={"jsonrpc": "2.0", "id": 1,
                         "method": "tools/list"}, headers={"Authorization": "Bearer mem_wrong"})  # fmt: skip
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "not_authenticated"
    get = httpx.get(
        timeout=30, url=live_server.url + "/mcp", headers={"Authorization": f"Bearer {_key(bob)}"}
    )
    assert get.status_code == 405


def test_trailing_slash_is_served_too(live_server, alice):
    async def work(session: ClientSession) -> list[str]:
        return [t.name for t in (await session.list_tools()).tools]

    names = asyncio.run(_session(live_server.url + "/mcp/", _key(alice), work))
    assert "manage_memory" in names


# --- stdio: manage.py mcp as a real process ------------------------------------------
def _stdio(*args: str) -> StdioServerParameters:
    env = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "memoryproject.settings_test",
        "EMBEDDED_DB_NAME": settings.DATABASES["default"]["NAME"],
        **{k: v for k, v in os.environ.items() if k.startswith(("MEMORY_DATA", "DATABASE_URL"))},
    }
    return StdioServerParameters(
        command=sys.executable, args=["manage.py", "mcp", *args], cwd=str(ROOT), env=env
    )


@pytest.mark.slow
def test_stdio_server_for_one_owner_and_scope(alice, bob):
    manage, _ = memory_tools(owner=alice, scope=SCOPE)
    fact_id = manage("User plays the violin")["id"]
    memory_tools(owner=bob, scope=SCOPE)[0]("User plays the drums")

    async def work() -> dict[str, Any]:
        async with stdio_client(_stdio("--owner", "alice", "--scope", "user", "alice")) as (r, w):
            async with ClientSession(r, w) as session:
                await session.initialize()
                tools = (await session.list_tools()).tools
                names = [t.name for t in tools]
                offered = {t.name: sorted(t.input_schema["properties"]) for t in tools}
                found = await session.call_tool("search_memory", {"query": "plays"})
                other = await session.call_tool(
                    "search_memory", {"scope": ["user", "carol"], "query": "plays"}
                )
                text = (await session.read_resource(scope_uri(SCOPE))).contents[0].text
                return {"names": names, "offered": offered, "found": found.structured_content,
                        "other": (other.is_error, other.content[0].text), "md": text}  # fmt: skip

    out = asyncio.run(work())
    assert sorted(out["names"]) == ["manage_memory", "retrieve_node_memory", "search_memory",
                                    "write_node_memory"]  # fmt: skip
    # one scope served: no tool offers a scope to choose
    assert not [name for name, props in out["offered"].items() if "scope" in props]
    assert "query" in out["offered"]["search_memory"]
    assert [h["id"] for h in out["found"]["results"]] == [fact_id]  # not bob's drums
    assert out["other"] == (True, "scope ['user', 'carol'] is not open to this server; it "
                            "serves ['user', 'alice'] (leave scope out)")  # fmt: skip
    assert f"User plays the violin (id: {fact_id})" in out["md"]


@pytest.mark.slow
def test_stdio_unknown_owner_exits_with_a_message():
    import subprocess

    params = _stdio("--owner", "nobody")
    done = subprocess.run(
        [params.command, *params.args], cwd=params.cwd, env=params.env, input="",
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "no user 'nobody'" in done.stderr and done.stdout == ""


@pytest.mark.slow
def test_stdio_answers_every_request_bad_lines_and_the_last_one_too(alice):
    """The SDK's stdio server answered nothing to a line that is not JSON, a batch or a
    request with a null id (a client waits for its own timeout), and dropped a request
    sent just before stdin closed (``printf ... | manage.py mcp``)."""
    import subprocess

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    call = {"jsonrpc": "2.0", "id": "last", "method": "tools/call",
            "params": {"name": "manage_memory",
                       "arguments": {"scope": ["user", "ann"], "content": "User likes tea"}}}  # fmt: skip
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
              "params": {"requestId": 11, "reason": "changed my mind"}}  # fmt: skip
    lines = [
        json.dumps(init), json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        "this is not json", json.dumps([{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}]),
        json.dumps({"jsonrpc": "2.0", "id": None, "method": "tools/list"}),
        json.dumps({"jsonrpc": "1.0", "id": 7, "method": "tools/list"}), "",
        json.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": [1]}),
        json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}), json.dumps(call),
        json.dumps({"jsonrpc": "2.0", "id": 11, "method": "tools/list"}), json.dumps(cancel),
        *(f"garbage {n}" for n in range(12)),  # (refusals last, just before the end)
    ]  # fmt: skip
    params = _stdio("--owner", "alice")
    started = time.monotonic()
    done = subprocess.run([params.command, *params.args], cwd=params.cwd, env=params.env,
                          input="\n".join(lines) + "\n", capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    # (no wait for an answer that is not due: the drain's limit is 120 s)
    assert time.monotonic() - started < 60
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers if "result" in a and a["id"] != 11] == [1, 9, "last"]
    assert [(a["id"], a["error"]["code"], a["error"]["message"]) for a in answers
            if "error" in a and a["id"] != 11] == [
        (None, -32700, "Parse error: the line is not JSON."),
        (None, -32600, "Invalid Request: send one JSON-RPC message, not a batch."),
        (None, -32600, "Invalid Request: id must be a string or an integer (MCP: not null); "
                       "leave it out for a notification."),
        (7, -32600, 'Invalid Request: jsonrpc must be "2.0".'),
        (8, -32600, "Invalid Request: params: Input should be an object"),
        *[(None, -32700, "Parse error: the line is not JSON.")] * 12,
    ]  # fmt: skip
    assert list(Fact.objects.filter(owner=alice).values_list("content", flat=True)) == [
        "User likes tea"
    ]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_a_415_in_the_error_shape(live_server, alice, content_type):
    """The SDK's own answer is a text/plain 400 ("Invalid Content-Type header")."""
    headers = {"Authorization": f"Bearer {_key(alice)}", "Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    before = Fact.objects.count()
    response = httpx.post(live_server.url + "/mcp", content=body, headers=headers, timeout=30)
    assert response.status_code == 415
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert Fact.objects.count() == before


def test_a_post_without_a_body_is_a_400_in_the_error_shape(live_server, alice):
    headers = {"Authorization": f"Bearer {_key(alice)}"}
    response = httpx.post(live_server.url + "/mcp", headers=headers, timeout=30)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "parse_error"
    assert "JSON-RPC message" in error["message"]


@pytest.mark.django_db(transaction=True)
def test_a_scope_given_as_a_string_is_refused_not_spelt_out(alice):
    """A new user's audit: MCP read ``"scope": "user"`` as its characters and wrote the
    fact to the scope ["u", "s", "e", "r"], where no search of the user's finds it (the
    tool's schema says an array; the REST door refuses it)."""
    from core.services import api_key_create
    from memories.facts.models import Fact, Scope
    from tests.core.key_clients import bearer_client, mcp_rpc

    _, raw = api_key_create(owner=alice, name="mcp")
    client = bearer_client(raw)
    for scope in ("user", "abc"):
        called = mcp_rpc(client, "tools/call", {"name": "manage_memory",
                                                "arguments": {"scope": scope, "content": "x"}})  # fmt: skip
        assert called["result"]["isError"] is True, called
        assert "scope must be a list" in called["result"]["content"][0]["text"]
    assert not Fact.objects.exists() and not Scope.objects.filter(owner=alice).exists()


def test_a_too_long_argument_is_not_echoed_back(alice, alice_client):
    """A new user's audit: 200 kB of content came back twice in the 400's body."""
    answer = alice_client.post("/api/v1/tools/search_memory/call",
                               {"scope": ["user", "u1"], "arguments": {"query": "x" * 200_000}},
                               format="json")  # fmt: skip
    assert answer.status_code == 400, answer.content[:300]
    assert len(answer.content) < 2_000
    assert "200000 characters is longer than 10000" in answer.json()["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_a_nul_in_an_argument_is_refused_naming_it(alice):
    """A new user's audit: MCP answered the database's own message ("PostgreSQL text
    fields cannot contain NUL (0x00) bytes"); the other doors name the field."""
    from core.services import api_key_create
    from memories.facts.models import Fact
    from tests.core.key_clients import bearer_client, mcp_rpc

    _, raw = api_key_create(owner=alice, name="mcp")
    client = bearer_client(raw)
    called = mcp_rpc(client, "tools/call", {"name": "manage_memory", "arguments": {
        "scope": ["user", "u1"], "content": "likes\x00 tea"}})  # fmt: skip
    assert called["result"]["isError"] is True, called
    assert called["result"]["content"][0]["text"].startswith("arguments.content: NUL")
    assert not Fact.objects.exists()


INVALID_REQUESTS = [
    ('{"jsonrpc": "1.0", "id": 3, "method": "tools/list"}', 3, -32600,
     'Invalid Request: jsonrpc must be "2.0".'),
    ('{"id": 3, "method": "tools/list"}', 3, -32600, 'Invalid Request: jsonrpc must be "2.0".'),
    ('{"jsonrpc": "2.0", "id": 3, "method": 5}', 3, -32600,
     "Invalid Request: method must be a string."),
    ("5", None, -32600, "Invalid Request: a JSON-RPC message is a JSON object."),
    ("[]", None, -32600, "Invalid Request: send one JSON-RPC message, not a batch."),
    ('[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]', None, -32600,
     "Invalid Request: send one JSON-RPC message, not a batch."),
    ('{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}', None, -32600,
     "Invalid Request: id must be a string or an integer (MCP: not null); leave it out for a "
     "notification."),
    ('{"jsonrpc": "2.0", "id": null, "method": "tools/list"}', None, -32600,
     "Invalid Request: id must be a string or an integer (MCP: not null); leave it out for a "
     "notification."),
    ('{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', None, -32600,
     "Invalid Request: id must be a string or an integer (MCP: not null); leave it out for a "
     "notification."),
    ('{"jsonrpc": "2.0", "id": 4}', 4, -32600,
     "Invalid Request: a message has a method (a request or a notification), or a result or "
     "an error (a response)."),
    ("{not json", None, -32700, "Parse error: the body is not JSON."),
    # (the SDK's own reading: -32602, a null id and its 2 KB dump before; stdio's answer)
    ('{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}', 1, -32600,
     "Invalid Request: params: Input should be an object"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "id", "code", "message"), INVALID_REQUESTS)
def test_a_message_that_is_no_json_rpc_request_gets_a_short_invalid_request(
    alice, body, id, code, message
):
    """A new client developer's audit: the SDK answered these -32602 ("Invalid params")
    with a 2 KB dump of its validation, and a request whose id is null or an object
    202 with no answer (taken for a notification), so a client waited for ever."""
    from core.services import api_key_create as make_key
    from tests.core.key_clients import bearer_client

    client = bearer_client(make_key(owner=alice, name="mcp")[1])
    before = Fact.objects.count()
    response = client.post("/mcp", body, content_type="application/json",
                           HTTP_ACCEPT="application/json, text/event-stream")  # fmt: skip
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content) == {
        "jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}
    }  # fmt: skip
    assert Fact.objects.count() == before


def test_requests_and_notifications_still_reach_the_server(alice):
    from core.services import api_key_create as make_key
    from tests.core.key_clients import bearer_client, mcp_rpc

    client = bearer_client(make_key(owner=alice, name="mcp")[1])
    listed = mcp_rpc(client, "tools/list")
    assert {t["name"] for t in listed["result"]["tools"]} >= {"manage_memory", "search_memory"}
    import jsonschema
    from drf_spectacular.generators import SchemaGenerator

    responses = SchemaGenerator().get_schema(request=None, public=True)["paths"]["/mcp"]
    answer = responses["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    jsonschema.validate(listed, answer)
    unknown = mcp_rpc(client, "tools/call", {"name": "nope", "arguments": {}})
    jsonschema.validate(unknown, answer)
    noted = client.post("/mcp", json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                        content_type="application/json",
                        HTTP_ACCEPT="application/json, text/event-stream")  # fmt: skip
    assert noted.status_code == 202 and b"".join(noted.streaming_content) == b""
