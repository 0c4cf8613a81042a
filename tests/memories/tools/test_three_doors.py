"""One script of calls through the three doors: the plain callables ``memory_tools()`` and
``node_memory_tools()`` return (door 1), OpenAI function calling over HTTP (door 2) and
MCP over HTTP with the SDK's client (door 3). Each door runs it for an owner of its own,
set up the same way (a flow whose node ``worker`` writes to a blackboard store), so the
answers must be identical, apart from the ids each run creates and the timestamps."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from mcp import ClientSession, MCPError

from memories.conversations.services import flow_create
from memories.stores.config import memory_config_apply
from memories.tools.callables import memory_tools, node_memory_tools
from memories.tools.registry import ToolError
from tests.factories import UserFactory
from tests.memories.tools.test_mcp import _key, _session

pytestmark = pytest.mark.django_db(transaction=True)
SCOPE = ["user", "alice"]
UNKNOWN = str(uuid.UUID(int=7))
SCOPED = {"manage_memory", "search_memory"}
WRITE = {"flow": "<flow>", "node_id": "worker", "input": "step 1", "output": "done 1"}

# (tool, arguments); "<id>" stands for the memory the first call created, "<flow>" for
# the door's flow
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("manage_memory", {"content": "User prefers dark mode", "category": "preference"}),
    ("manage_memory", {"content": "User prefers dark mode"}),
    ("manage_memory", {"content": "User prefers green tea", "category": "preference"}),
    ("search_memory", {"query": "dark mode", "limit": 3}),
    ("search_memory", {"query": "User prefers", "limit": 1, "offset": 1}),
    ("manage_memory", {"action": "update", "id": "<id>", "content": "User prefers light mode"}),
    ("search_memory", {"query": "light mode", "filter": {"category": "preference"}}),
    ("search_memory", {"query": "x", "filter": {"category": "goal"}}),
    ("write_node_memory", WRITE),
    ("write_node_memory", {**WRITE, "input": "step 2", "output": "done 2", "session_id": "s2"}),
    ("retrieve_node_memory", {"flow": "<flow>", "node_id": "worker", "query": "", "stage": "gen"}),
    # errors
    ("manage_memory", {"action": "update", "content": "no id"}),
    ("manage_memory", {"action": "delete", "id": UNKNOWN}),
    ("manage_memory", {"action": "forget", "id": "<id>"}),
    ("search_memory", {"query": "x", "offset": -1}),
    ("retrieve_node_memory", {"flow": UNKNOWN, "node_id": "worker", "query": "x"}),
    ("write_node_memory", {**WRITE, "node_id": "nobody"}),
    ("manage_memory", {"action": "delete", "id": "<id>"}),
    ("search_memory", {"query": "light mode"}),
]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _owner(name: str) -> tuple[Any, str]:
    """An owner with a flow whose node ``worker`` writes to and reads a blackboard store."""
    owner = UserFactory(username=name)
    flow = flow_create(owner=owner, name="support-bot")
    memory_config_apply(owner=owner, document={
        "memory": [{"name": "log", "type": "blackboard", "config": {"max_items": 5}}],
        "nodes": [{"id": "worker", "flow": flow.name, "memories": [{"name": "log"}]}],
    })  # fmt: skip
    return owner, str(flow.pk)


def _fill(arguments: dict[str, Any], created: str | None, flow: str) -> dict[str, Any]:
    swap = {"<id>": created, "<flow>": flow}
    return {k: swap.get(v, v) if isinstance(v, str) else v for k, v in arguments.items()}


def _normal(answers: list[dict[str, Any]], flow: str) -> list[Any]:
    """The run's answers with each id it made named by its order of appearance, the flow
    named <flow>, timestamps dropped and scores rounded."""
    text = json.dumps(answers).replace(flow, "<flow>")
    labels: dict[str, str] = {}
    text = UUID.sub(lambda m: labels.setdefault(m[0], f"<uuid {len(labels)}>"), text)
    value = json.loads(text)
    for answer in value:
        for hit in answer.get("result", {}).get("results", []):
            for name in ("created_at", "updated_at", "observed_at", "recorded_from"):
                hit.pop(name, None)
            if "score" in hit:  # (the decay moves with the time of each call)
                hit["score"] = round(hit["score"], 6)
        for store in answer.get("result", {}).get("stores", []):
            for hit in store["hits"]:
                hit["id"] = "<item>"
                hit["item_id"] = "<item>" if hit.get("item_id") is not None else None
        for write in answer.get("result", {}).get("results", []):
            if "item_id" in write:
                write["item_id"] = "<item>" if write["item_id"] is not None else None
    return value


def _run_script(call: Callable[[str, dict[str, Any]], dict[str, Any]], flow: str) -> list[Any]:
    answers: list[dict[str, Any]] = []
    created = None
    for name, arguments in SCRIPT:
        answer = call(name, _fill(arguments, created, flow))
        if created is None and "result" in answer:
            created = answer["result"]["id"]
        answers.append(answer)
    return _normal(answers, flow)


def _door_1(owner: Any) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    manage_memory, search_memory = memory_tools(owner=owner, scope=SCOPE)
    retrieve_node_memory, write_node_memory = node_memory_tools(owner=owner)
    functions = {f.__name__: f for f in (manage_memory, search_memory, retrieve_node_memory,
                                         write_node_memory)}  # fmt: skip

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"result": functions[name](**arguments)}
        except ToolError as exc:
            return {"error": str(exc)}

    return call


def _door_2(api: httpx.Client) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        sent = {"scope": SCOPE, "arguments": arguments} if name in SCOPED else {
            "arguments": arguments}  # fmt: skip
        body = api.post(f"/api/v1/tools/{name}/call", json=sent).json()
        return {"result": body["result"]} if "result" in body else {
            "error": body["error"]["message"]}  # fmt: skip

    return call


def _door_3(live_server: Any, key: str, flow: str) -> list[Any]:
    """The script over one MCP session (the SDK's client; its calls are coroutines)."""

    async def work(session: ClientSession) -> list[Any]:
        answers: list[dict[str, Any]] = []
        created = None
        for name, arguments in SCRIPT:
            filled = _fill(arguments, created, flow)
            sent = {"scope": SCOPE, **filled} if name in SCOPED else filled
            result = await session.call_tool(name, sent)
            answer = ({"error": result.content[0].text} if result.is_error
                      else {"result": result.structured_content})  # fmt: skip
            if created is None and "result" in answer:
                created = answer["result"]["id"]
            answers.append(answer)
        return _normal(answers, flow)

    return asyncio.run(_session(live_server.url + "/mcp", key, work))


def test_the_three_doors_answer_the_same(live_server, engine_storage):
    owners = [_owner(name) for name in ("door1", "door2", "door3")]
    (owner_1, flow_1), (owner_2, flow_2), (owner_3, flow_3) = owners
    first = _run_script(_door_1(owner_1), flow_1)

    kinds = [next(iter(a)) for a in first]
    assert kinds == ["result"] * 11 + ["error"] * 6 + ["result"] * 2
    results = [a.get("result") for a in first]
    assert [(r["action"], r["id"]) for r in (results[i] for i in (0, 1, 2, 5, 17))] == [
        ("created", "<uuid 0>"), ("unchanged", "<uuid 0>"), ("created", "<uuid 1>"),
        ("updated", "<uuid 0>"), ("deleted", "<uuid 0>"),
    ]  # fmt: skip

    def found(index: int) -> list[str]:
        return [h["content"] for h in results[index]["results"]]

    assert found(3) == ["User prefers dark mode", "User prefers green tea"]
    assert found(4) == ["User prefers green tea"]  # limit 1, offset 1: the second best
    assert found(6) == ["User prefers light mode", "User prefers green tea"]
    assert found(7) == []  # no goal
    assert [(w["store"], w["action"]) for w in results[8]["results"] + results[9]["results"]] == [
        ("log", "added"), ("log", "added"),
    ]  # fmt: skip
    assert [h["content"] for h in results[10]["stores"][0]["hits"]] == [
        "Input: step 2 Output: done 2", "Input: step 1 Output: done 1",  # newest first
    ]  # fmt: skip
    assert [a["error"] for a in first if "error" in a] == [
        "id is required to update a memory; call search_memory to find the id of the memory "
        "you mean",
        "no memory with id <uuid 2> in scope ['user', 'alice']; call search_memory to find the "
        "id of the memory you mean",
        "invalid arguments: action: 'forget' is not one of ['create', 'update', 'delete']",
        "invalid arguments: offset: -1 is less than the minimum of 0",
        "no flow with id <uuid 2>; give the id of one of your flows",
        "node 'nobody' of flow 'support-bot' has no memory attachments",
    ]
    assert found(18) == ["User prefers green tea"]

    api = httpx.Client(timeout=30, base_url=live_server.url,
                       headers={"Authorization": f"Bearer {_key(owner_2)}"})  # fmt: skip
    assert _run_script(_door_2(api), flow_2) == first
    assert _door_3(live_server, _key(owner_3), flow_3) == first


def test_an_unknown_tool_is_refused_by_both_remote_doors_with_the_same_message(live_server):
    """Door 1 has no callable for a tool that does not exist; over HTTP it is a 404, over
    MCP a JSON-RPC protocol error (-32602), as the MCP specification has it."""
    owner = UserFactory(username="door")
    key = _key(owner)
    http = httpx.post(
        f"{live_server.url}/api/v1/tools/no_such_tool/call", json={"arguments": {}},
        headers={"Authorization": f"Bearer {key}"}, timeout=30,
    ).json()  # fmt: skip

    async def work(session: ClientSession) -> Any:
        with pytest.raises(MCPError) as err:
            await session.call_tool("no_such_tool", {})
        return err.value.error

    error = asyncio.run(_session(live_server.url + "/mcp", key, work))
    assert http["error"]["code"] == "tool_not_found"
    assert (error.code, error.message) == (-32602, http["error"]["message"])
    assert error.message == (
        "there is no tool named 'no_such_tool'; the tools are: manage_memory, "
        "retrieve_node_memory, search_memory, write_node_memory"
    )
