"""One script of calls through the three doors (in process, OpenAI function calling,
MCP over HTTP), one after the other in the same scope: the same answers, apart from
the id of the memory each run creates and its timestamps."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest
from mcp import ClientSession

from memories.tools.registry import ToolError, tool_call
from tests.memories.tools.test_mcp import _key, _session

pytestmark = pytest.mark.django_db(transaction=True)
SCOPE = ["user", "alice"]
UNKNOWN = str(uuid.UUID(int=7))

# (tool, arguments); "<id>" stands for the id the first call created
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("manage_memory", {"content": "User prefers dark mode", "category": "preference"}),
    ("manage_memory", {"content": "User prefers dark mode"}),
    ("search_memory", {"query": "dark mode", "limit": 3}),
    ("manage_memory", {"action": "update", "id": "<id>", "content": "User prefers light mode"}),
    ("search_memory", {"query": "which theme", "filter": {"category": "preference"}}),
    ("search_memory", {"query": "x", "filter": {"category": "goal"}}),
    ("manage_memory", {"action": "update", "content": "no id"}),
    ("manage_memory", {"action": "delete", "id": UNKNOWN}),
    ("manage_memory", {"action": "forget", "id": "<id>"}),
    ("search_memory", {"query": "x", "offset": -1}),
    ("no_such_tool", {}),
    ("manage_memory", {"action": "delete", "id": "<id>"}),
    ("search_memory", {"query": "light mode"}),
]


def _fill(arguments: dict[str, Any], created: str | None) -> dict[str, Any]:
    return {k: (created if v == "<id>" else v) for k, v in arguments.items()}


def _normal(answer: Any, created: str | None) -> Any:
    """The answer with this run's id written "<id>" and timestamps dropped."""
    text = json.dumps(answer)
    if created:
        text = text.replace(created, "<id>")
    value = json.loads(text)
    for hit in value.get("result", {}).get("results", []) if isinstance(value, dict) else []:
        hit.pop("created_at"), hit.pop("updated_at")
    return value


def _run_script(call: Any) -> list[Any]:
    answers, created = [], None
    for name, arguments in SCRIPT:
        answer = call(name, _fill(arguments, created))
        if created is None and "result" in answer:
            created = answer["result"]["id"]
        answers.append(_normal(answer, created))
    return answers


def test_the_three_doors_answer_the_same(live_server, alice):
    def in_process(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"result": tool_call(owner=alice, name=name, arguments=arguments, scope=SCOPE)}
        except ToolError as exc:
            return {"error": str(exc)}

    key = _key(alice)
    api = httpx.Client(
        timeout=30, base_url=live_server.url, headers={"Authorization": f"Bearer {key}"}
    )

    def function_calling(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body = api.post(f"/api/v1/tools/{name}/call", json={"scope": SCOPE,
                        "arguments": arguments}).json()  # fmt: skip
        return (
            {"result": body["result"]} if "result" in body else {"error": body["error"]["message"]}
        )

    def over_mcp(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        async def work(session: ClientSession) -> dict[str, Any]:
            answer = await session.call_tool(name, {"scope": SCOPE, **arguments})
            if answer.is_error:
                return {"error": answer.content[0].text}
            return {"result": answer.structured_content}

        return asyncio.run(_session(live_server.url + "/mcp", key, work))

    first = _run_script(in_process)
    assert first[0]["result"]["action"] == "created" and first[1]["result"]["action"] == "unchanged"
    assert [h["content"] for h in first[4]["result"]["results"]] == ["User prefers light mode"]
    assert first[-1] == {"result": {"mode": "hybrid", "results": []}}
    assert [("error" in a) for a in first] == [False] * 6 + [True] * 5 + [False] * 2
    assert _run_script(function_calling) == first
    assert _run_script(over_mcp) == first
