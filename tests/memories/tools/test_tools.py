"""Doors 1 and 2: the tools in process and over OpenAI function calling."""

from __future__ import annotations

import uuid

import pytest

from memories.facts.models import Fact, FactChange
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_list
from memories.stores.models import MemoryItem
from memories.tools.callables import memory_tools, node_memory_tools
from memories.tools.registry import ToolError, openai_tools, tool_call
from tests.memories.facts.conftest import fixture_embedder  # noqa: F401

pytestmark = pytest.mark.django_db
SCOPE = ["user", "alice"]


def _facts(owner, scope=SCOPE):
    row = scope_find(owner=owner, scope=tuple(scope))
    return [] if row is None else sorted(v.content for v in fact_list(scope=row))


def test_manage_and_search_in_process_follow_langmem(alice):
    manage_memory, search_memory = memory_tools(owner=alice, scope=SCOPE)
    created = manage_memory("User prefers dark mode")
    fact_id = created["id"]
    assert created == {
        "action": "created", "id": fact_id, "content": "User prefers dark mode",
        "message": f"Created memory {fact_id}.",
    }  # fmt: skip
    assert manage_memory("User prefers dark mode") == {
        "action": "unchanged", "id": fact_id, "content": "User prefers dark mode",
        "message": f"Already remembered as memory {fact_id}; nothing was added.",
    }  # fmt: skip
    # a fact of the same meaning that says another thing: the stored one is shown, and
    # how to change it (the caller's own text was shown, as if stored)
    assert manage_memory("user prefers DARK MODE.") == {
        "action": "unchanged", "id": fact_id, "content": "User prefers dark mode",
        "message": f"Already remembered, in other words, as memory {fact_id}: 'User prefers "
        f"dark mode'; nothing was added. If that is wrong, call again with action 'update', "
        f"id {fact_id} and the new content.",
    }  # fmt: skip
    found = search_memory("dark mode", limit=5)
    assert found["mode"] == "hybrid"
    assert [(h["id"], h["content"], h["category"]) for h in found["results"]] == [
        (fact_id, "User prefers dark mode", "context")
    ]
    assert manage_memory("User prefers light mode", action="update", id=fact_id) == {
        "action": "updated", "id": fact_id, "content": "User prefers light mode",
        "message": f"Updated memory {fact_id}.",
    }  # fmt: skip
    assert _facts(alice) == ["User prefers light mode"]
    changes = FactChange.objects.filter(scope__owner=alice).count()
    assert manage_memory("User prefers light mode", action="update", id=fact_id) == {
        "action": "unchanged", "id": fact_id, "content": "User prefers light mode",
        "message": f"Memory {fact_id} already says this; nothing changed.",
    }  # fmt: skip
    assert FactChange.objects.filter(scope__owner=alice).count() == changes
    assert manage_memory(action="delete", id=fact_id) == {
        "action": "deleted", "id": fact_id, "message": f"Deleted memory {fact_id}.",
    }  # fmt: skip
    assert _facts(alice) == []
    assert search_memory("dark mode")["results"] == []
    actions = list(FactChange.objects.filter(scope__owner=alice).values_list("action", flat=True))
    assert sorted(actions) == ["add", "delete", "update"]


@pytest.mark.parametrize(
    ("arguments", "message", "status"),
    [
        ({"action": "update", "content": "x"}, "id is required to update a memory; call "
         "search_memory to find the id of the memory you mean", 400),
        ({"action": "delete", "id": "nope"}, "id 'nope' is not a valid id; call search_memory "
         "to find the id of the memory you mean", 400),
        ({"action": "create"}, "content is required to create a memory: give the fact to "
         "remember as one sentence", 400),
        ({"action": "explode", "content": "x"}, "invalid arguments: action: 'explode' is not "
         "one of ['create', 'update', 'delete']", 400),
        ({"content": "x", "colour": "red"}, "invalid arguments: Additional properties are not "
         "allowed ('colour' was unexpected); the arguments are: content, action, id, category",
         400),
    ],
)  # fmt: skip
def test_manage_errors_say_what_to_do_and_change_nothing(alice, arguments, message, status):
    with pytest.raises(ToolError) as err:
        tool_call(owner=alice, name="manage_memory", arguments=arguments, scope=SCOPE)
    assert (str(err.value), err.value.status_code) == (message, status)
    assert Fact.objects.count() == 0 and FactChange.objects.count() == 0


def test_another_scope_or_owner_cannot_touch_a_memory(alice, bob):
    manage_alice, _ = memory_tools(owner=alice, scope=SCOPE)
    fact_id = manage_alice("User plays the violin")["id"]
    manage_bob, search_bob = memory_tools(owner=bob, scope=SCOPE)
    manage_other, _ = memory_tools(owner=alice, scope=["user", "carol"])
    for manage in (manage_bob, manage_other):
        with pytest.raises(ToolError) as err:
            manage(action="delete", id=fact_id)
        assert err.value.status_code == 404 and err.value.code == "memory_not_found"
        assert str(err.value).startswith(f"no memory with id {fact_id} in scope")
    assert search_bob("violin")["results"] == []
    assert _facts(alice) == ["User plays the violin"]


def test_unknown_tool_and_missing_scope(alice):
    with pytest.raises(ToolError) as err:
        tool_call(owner=alice, name="forget_everything", arguments={})
    assert err.value.status_code == 404 and str(err.value) == (
        "there is no tool named 'forget_everything'; the tools are: manage_memory, "
        "retrieve_node_memory, search_memory, write_node_memory"
    )
    with pytest.raises(ToolError) as err:
        tool_call(owner=alice, name="search_memory", arguments={"query": "x"})
    assert err.value.code == "scope_required"
    with pytest.raises(ToolError) as err:
        tool_call(owner=alice, name="search_memory", arguments={"query": "x"},
                  scope=["user", "{user_id}"])  # fmt: skip
    assert err.value.code == "scope_value_missing"


def test_openai_tools_are_function_entries_with_json_schema():
    tools = {t["function"]["name"]: t for t in openai_tools()}
    assert set(tools) == {"manage_memory", "search_memory", "retrieve_node_memory",
                          "write_node_memory"}  # fmt: skip
    manage = tools["manage_memory"]
    assert manage["type"] == "function"
    assert manage["function"]["parameters"]["properties"]["action"]["enum"] == [
        "create", "update", "delete",
    ]  # fmt: skip
    assert tools["search_memory"]["function"]["parameters"]["required"] == ["query"]


# --- over HTTP ----------------------------------------------------------------------
def test_list_tools_over_http(alice_client, anon_client):
    answer = alice_client.get("/api/v1/tools")
    assert answer.status_code == 200
    assert answer.json() == {"tools": openai_tools()}
    assert anon_client.get("/api/v1/tools").status_code == 401


def test_call_tools_over_http(alice, alice_client, bob_client):
    created = alice_client.post(
        "/api/v1/tools/manage_memory/call",
        {"scope": ["user", "{user_id}"], "arguments": {"content": "User lives in Lisbon"}},
        format="json",
        HTTP_X_OPENWEBUI_USER_ID="alice",
    )
    assert created.status_code == 200
    body = created.json()
    fact_id = body["result"]["id"]
    assert body == {
        "name": "manage_memory", "scope": SCOPE,
        "result": {"action": "created", "id": fact_id, "content": "User lives in Lisbon",
                   "message": f"Created memory {fact_id}."},
    }  # fmt: skip
    found = alice_client.post(
        "/api/v1/tools/search_memory/call",
        {"scope": SCOPE, "arguments": {"query": "Lisbon", "limit": 3}},
        format="json",
    ).json()
    assert [h["id"] for h in found["result"]["results"]] == [fact_id]
    # bob's key: his scope is empty and alice's id is a 404 that changes nothing
    assert bob_client.post(
        "/api/v1/tools/search_memory/call", {"scope": SCOPE, "arguments": {"query": "Lisbon"}},
        format="json",
    ).json()["result"]["results"] == []  # fmt: skip
    denied = bob_client.post(
        "/api/v1/tools/manage_memory/call",
        {"scope": SCOPE, "arguments": {"action": "delete", "id": fact_id}},
        format="json",
    )
    assert denied.status_code == 404
    assert denied.json()["error"]["code"] == "memory_not_found"
    assert _facts(alice) == ["User lives in Lisbon"]


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "message"),
    [
        ("/api/v1/tools/nope/call", {}, 404, "tool_not_found",
         "there is no tool named 'nope'; the tools are: manage_memory, retrieve_node_memory, "
         "search_memory, write_node_memory"),
        ("/api/v1/tools/search_memory/call", {"scope": SCOPE, "arguments": {"limit": 3}}, 400,
         "invalid_arguments", "invalid arguments: 'query' is a required property: give it and "
         "call again"),
        ("/api/v1/tools/search_memory/call",
         {"scope": SCOPE, "arguments": {"query": "x", "limit": 500}}, 400, "invalid_arguments",
         "invalid arguments: limit: 500 is greater than the maximum of 100"),
        ("/api/v1/tools/manage_memory/call",
         {"scope": SCOPE, "arguments": {"action": "delete", "id": str(uuid.uuid4())}}, 404,
         "memory_not_found", None),
        ("/api/v1/tools/search_memory/call", {"scope": "user", "arguments": {"query": "x"}},
         400, "invalid", None),
    ],
)  # fmt: skip
def test_http_errors_are_json_with_an_actionable_message(
    alice, alice_client, path, body, status, code, message
):
    answer = alice_client.post(path, body, format="json")
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["code"] == code
    if message is not None:
        assert error["message"] == message
    assert Fact.objects.count() == 0


def test_node_store_tools(alice, bob, alice_client, flow):
    doc = {
        "memory": [{"name": "log", "type": "blackboard", "config": {"max_items": 5}}],
        "nodes": [{"id": "worker", "flow": flow.name, "memories": [{"name": "log", "top_k": 5}]}],
    }
    assert alice_client.post("/api/v1/memory-config", doc, format="json").status_code == 200
    retrieve, write = node_memory_tools(owner=alice)
    assert write(str(flow.pk), "worker", "step 1", "done 1") == {
        "results": [{"store": "log", "type": "blackboard", "action": "added",
                     "item_id": MemoryItem.objects.get().pk, "reason": ""}],
        "errors": [],
    }  # fmt: skip
    found = retrieve(str(flow.pk), "worker", "", stage="gen")
    assert found["errors"] == []
    assert [h["content"] for h in found["stores"][0]["hits"]] == ["Input: step 1 Output: done 1"]
    assert found["prompt"].startswith("===== Related Memories =====")
    # bob cannot reach alice's flow: a 404 that says what to give instead
    retrieve_bob, write_bob = node_memory_tools(owner=bob)
    with pytest.raises(ToolError) as err:
        write_bob(str(flow.pk), "worker", "step 2", "done 2")
    assert err.value.status_code == 404
    assert str(err.value) == f"no flow with id {flow.pk}; give the id of one of your flows"
    assert MemoryItem.objects.count() == 1


def test_node_tools_take_the_ids_rest_takes_and_call_a_bad_one_an_argument(alice, alice_client,
                                                                          flow):  # fmt: skip
    """The tools refused a session id of 201-255 characters that REST takes, said node
    ids may have 200 (they have 128), and answered a bad node id ``invalid``, not
    ``invalid_arguments`` as every bad argument of a tool."""
    doc = {
        "memory": [{"name": "log", "type": "blackboard"}],
        "nodes": [{"id": "worker", "flow": flow.name, "memories": [{"name": "log"}]}],
    }
    assert alice_client.post("/api/v1/memory-config", doc, format="json").status_code == 200
    long_session = "s" * 230
    call = "/api/v1/tools/write_node_memory/call"
    args = {"flow": str(flow.pk), "node_id": "worker", "input": "a", "output": "done",
            "session_id": long_session}  # fmt: skip
    written = alice_client.post(call, {"arguments": args}, format="json")
    assert written.status_code == 200, written.content
    assert written.json()["result"]["results"][0]["action"] == "added"
    bad = alice_client.post(call, {"arguments": {**args, "node_id": "no such node!"}},
                            format="json")  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_arguments"
    assert MemoryItem.objects.count() == 1
    listed = {t["function"]["name"]: t["function"]
              for t in alice_client.get("/api/v1/tools").json()["tools"]}  # fmt: skip
    properties = listed["write_node_memory"]["parameters"]["properties"]
    assert (properties["node_id"]["maxLength"], properties["session_id"]["maxLength"]) == (128, 255)


@pytest.mark.usefixtures("fixture_embedder")
def test_manage_memory_creating_the_opposite_of_a_memory_replaces_it(alice):
    manage_memory, _search = memory_tools(owner=alice, scope=SCOPE)
    vegan = manage_memory("User is vegan")["id"]
    created = manage_memory("User is not vegan")
    assert created == {
        "action": "created", "id": created["id"], "content": "User is not vegan",
        "message": f"Created memory {created['id']}. It replaces memory {vegan}, which said "
        "otherwise.",
        "replaced_id": vegan,
    }  # fmt: skip
    assert _facts(alice) == ["User is not vegan"]
