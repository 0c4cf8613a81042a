"""The cross-tenant sweep: a second owner aims every owner-scoped endpoint family at the
first owner's objects, through the real gunicorn.

The first owner ("victim", the suite's user) holds one of everything: a flow with a run
and node turns, a knowledge base with a document (and its ingest job), a Memory Base
(and a flush job), user and global memories, memory stores (a ``simple`` one with items
and a blackboard) attached to an agent node, engine facts, a flush and a dream of a
scope, an API key. Every text it holds carries a secret word. The second owner
("intruder", a key of its own) then reads, writes and deletes those objects by their
ids, over the REST API, the tools endpoint and MCP (``/mcp``), and probes the names that
live in its own namespace (its own end user "u1", its own scope ``user/u1``).

What must hold: an object of the victim's answers 404 (or the documented refusal: a
config naming another owner's flow is a 400 ``invalid_config``; a tool or MCP call
answers a tool error); a probe of the intruder's own namespace answers its own (empty)
data; no answer anywhere holds the secret; and every project table is unchanged (row
counts and an md5 of every row, before and after).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from scripts.faults.attacks import _changed, settled_digest
from scripts.faults.harness import Instance, Reply

SCOPE = ["user", "u1"]
SCOPE_QUERY = "scope=user&scope=u1"
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@dataclass(frozen=True)
class Probe:
    """One request of the intruder. ``expect``: "404" (an object of the victim's),
    "refused" (the documented refusal: ``status``), "own" (the intruder's own namespace:
    a status in ``allowed``), "tool_error" (a tool call refused inside a 200, over MCP)."""

    family: str
    method: str
    path: str
    body: Any = None
    expect: str = "404"
    status: int = 404
    allowed: tuple[int, ...] = (200, 404)
    check: Callable[[Any], str | None] | None = None  # more to see in an "own" answer


def _empty(key: str) -> Callable[[Any], str | None]:
    """The answer's ``key`` holds nothing (the intruder's own namespace is empty)."""

    def check(body: Any) -> str | None:
        found = body.get(key) if isinstance(body, dict) else None
        return None if found in ([], "", None) else f"{key} is not empty"

    return check


def _flow_refused(body: Any) -> str | None:
    """A 400 ``invalid_config`` that names the node's flow (not yours)."""
    error = body.get("error") if isinstance(body, dict) else None
    details = (error or {}).get("details") or {}
    return None if "nodes[0].flow" in details else f"the flow is not named: {error}"


def _only_creates(body: Any) -> str | None:
    """A dry run of the victim's store names plans new stores of the intruder's own."""
    changes = body.get("changes") if isinstance(body, dict) else None
    if not changes or any(c["kind"] == "store" and c["action"] != "create" for c in changes):
        return f"the plan is not all creates: {changes}"
    return None


def _victim(inst: Instance, secret: str) -> dict[str, Any]:
    """One of each owner-scoped object, owned by the suite's user, every text holding
    ``secret``."""
    tag = secret[-8:]
    flow = inst.post("/api/v1/flows", {"name": f"victim-{tag}"}).body["id"]
    run = {
        "session_id": "s1",
        "messages": [
            {"role": "user", "content": f"hello {secret}", "message_id": "m1"},
            {"role": "assistant", "content": f"an answer {secret}", "message_id": "m2"},
        ],
    }
    assert inst.post(f"/api/v1/flows/{flow}/runs", run).status in (200, 201, 202)
    kb = inst.post("/api/v1/knowledge-bases", {"name": f"victim-{tag}"}).body["id"]
    docs = inst.post(
        f"/api/v1/knowledge-bases/{kb}/documents",
        {"documents": [{"text": f"tea facts {secret}"}], "background": True},
    ).body
    kb_job = docs.get("id")
    mb = inst.post("/api/v1/memory-bases", {"name": f"victim-{tag}", "flow": flow}).body
    jobs = inst.post(f"/api/v1/memory-bases/{mb['id']}/flush", {}).body.get("jobs") or []
    added = inst.post("/api/v1/users/u1/memories", {"content": f"likes {secret}", "infer": False})
    memory = (added.body.get("memories") or added.body.get("duplicates"))[0]["id"]
    global_memory = inst.post("/api/v1/global-memories", {"content": f"opens {secret}"}).body
    turn = {"flow": flow, "message_id": "t1", "user_content": secret, "assistant_content": "ok"}
    inst.post("/api/v1/conversations/s1/nodes/n1/turns", turn)
    config = {
        "memory": [
            {"name": f"notes-{tag}", "type": "simple", "config": {}},
            {"name": f"board-{tag}", "type": "blackboard", "config": {}},
        ],
        "nodes": [
            {
                "id": "mem",
                "flow": flow,
                "memories": [{"name": f"notes-{tag}"}, {"name": f"board-{tag}"}],
            }
        ],
    }
    assert inst.post("/api/v1/memory-config", config).status == 200
    written = inst.post(
        f"/api/v1/flows/{flow}/nodes/mem/memory/write",
        {"input": f"What is {secret}?", "output": f"It is the word {secret}, kept here."},
    ).body["results"]
    stores = {s["name"]: s["id"] for s in inst.get("/api/v1/memory-stores").body["results"]}
    fact = inst.post("/api/v1/engine/facts", {"scope": SCOPE, "content": f"prefers {secret}"})
    assert fact.status == 201, fact.body
    # Without an LLM the API refuses a flush (503) and a dream: the rows are made here,
    # a flush due tomorrow (no schedule: nothing runs it during the sweep).
    made = inst.manage(
        "shell",
        "-c",
        "from datetime import timedelta\n"
        "from django.utils import timezone\n"
        "from memories.engine.models import Dream, PendingUpdate\n"
        "from memories.facts.models import Scope\n"
        "u = Scope.objects.get(owner__username='fault', path=['user', 'u1'])\n"
        "PendingUpdate.objects.create(owner_id=u.owner_id, scope=u, source='api', "
        f"messages=[{{'role': 'user', 'content': 'I like {secret}'}}], "
        "due_at=timezone.now() + timedelta(days=1))\n"
        "print(Dream.objects.create(owner_id=u.owner_id, scope=u, lookback_days=1, "
        f"input_hash='h', diary='dreamt of {secret}').pk)",
    ).strip()
    key = inst.post("/api/v1/api-keys", {"name": f"victim-{tag}"}).body["id"]
    return {
        "flow": flow,
        "flow_name": f"victim-{tag}",
        "kb": kb,
        "kb_job": kb_job or str(uuid.uuid4()),
        "mb": mb["id"],
        "mb_kb": mb["knowledge_base"],
        "job": jobs[0]["id"] if jobs else str(uuid.uuid4()),
        "memory": memory,
        "global_memory": global_memory["id"],
        "store": stores[f"notes-{tag}"],
        "board": stores[f"board-{tag}"],
        "item": next(r["item_id"] for r in written if r["store"] == f"notes-{tag}"),
        "board_item": next(r["item_id"] for r in written if r["store"] == f"board-{tag}"),
        "store_names": [f"notes-{tag}", f"board-{tag}"],
        "fact": fact.body["fact"]["id"],
        "dream": made.splitlines()[-1],
        "key": key,
    }


Row = tuple[str, str] | tuple[str, str, Any]  # (method, path[, body])


def _probes(family: str, rows: list[Row], **expect: Any) -> list[Probe]:
    return [Probe(family, *row, **expect) for row in rows]


def _rest(v: dict[str, Any]) -> list[Probe]:
    f, kb, mb, job = v["flow"], v["kb"], v["mb"], v["job"]
    rows: list[Row] = [("POST", "/api/v1/memory-bases", {"name": "stolen", "flow": f})]
    for prefix in ("memory-bases", "memories"):
        at = f"/api/v1/{prefix}/{mb}"
        rows += [("GET", at), ("PATCH", at, {"name": "taken over"}), ("GET", f"{at}/sessions"),
                 ("POST", f"{at}/flush", {}), ("POST", f"{at}/update", {}),
                 ("POST", f"{at}/regenerate", {}), ("DELETE", at)]  # fmt: skip
    out = _probes("memory bases and sessions", rows)
    rows = [
        ("POST", "/api/v1/search", {"query": "tea", "knowledge_base_ids": [kb, v["mb_kb"]]}),
        ("POST", "/api/v1/search", {"query": "tea", "knowledge_base_ids": [kb], "mode": "keyword"}),
    ]
    for base in (kb, v["mb_kb"]):
        at = f"/api/v1/knowledge-bases/{base}"
        rows += [("GET", at), ("PATCH", at, {"name": "taken over"}), ("GET", f"{at}/chunks"),
                 ("GET", f"{at}/chunks?session_id=s1"), ("GET", f"{at}/chunks?flow_id={f}"),
                 ("POST", f"{at}/documents", {"documents": [{"text": "planted"}]}),
                 ("POST", f"{at}/search", {"query": "tea"}),
                 ("POST", f"{at}/search", {"query": "tea", "mode": "vector"}),
                 ("POST", f"{at}/search", {"query": "tea", "mode": "keyword"}),
                 ("GET", f"{at}/jobs/{v['kb_job']}"), ("GET", f"{at}/jobs/{job}"),
                 ("DELETE", at)]  # fmt: skip
    out += _probes("knowledge bases, documents, search", rows)
    out += _probes("jobs", [("GET", f"/api/v1/jobs/{job}"), ("GET", f"/api/v1/jobs/{v['kb_job']}")])
    turn = {"flow": f, "message_id": "x1", "user_content": "a", "assistant_content": "b"}
    out += _probes("flows, runs, messages, conversations", [
        ("GET", f"/api/v1/flows/{f}"),
        ("POST", f"/api/v1/flows/{f}/runs",
         {"session_id": "s1", "messages": [{"role": "user", "content": "x"}]}),
        ("POST", "/api/v1/messages", {"flow": f, "session_id": "s1", "role": "user", "content": "x"}),
        ("GET", f"/api/v1/messages?flow={f}"), ("GET", f"/api/v1/messages?flow={f}&session_id=s1"),
        ("GET", f"/api/v1/messages?memory_base_id={mb}"),
        ("DELETE", f"/api/v1/flows/{f}/sessions/s1/messages"),
        ("GET", f"/api/v1/conversations/s1/history?flow={f}"),
        ("GET", f"/api/v1/conversations/s1/nodes/n1/history?flow={f}"),
        ("POST", "/api/v1/conversations/s1/nodes/n1/turns", turn),
        ("DELETE", f"/api/v1/conversations/s1/nodes/n1?flow={f}"),
    ])  # fmt: skip
    rows = [("DELETE", f"/api/v1/global-memories/{v['global_memory']}")]
    for user in ("u1", "u2"):  # the victim's end user, and another id for the same memory
        at = f"/api/v1/users/{user}/memories/{v['memory']}"
        rows += [("GET", at), ("PATCH", at, {"content": "taken"}), ("DELETE", at)]
    rows.append(("GET", f"/api/v1/users/u1/memories/{v['memory']}/history"))
    out += _probes("users' memories", rows)
    # The intruder's own end user "u1" (another person than the victim's "u1"), which the
    # intruder does not have: 404 scope_not_found, as for the engine's scopes.
    out += _probes("users' memories", [("GET", "/api/v1/users/u1/memories"),
                                       ("GET", "/api/v1/users/u1/memories/search?q=likes"),
                                       ("POST", "/api/v1/users/u1/memories/search",
                                        {"query": "likes"}),
                                       ("DELETE", "/api/v1/users/u1/memories")])  # fmt: skip
    return out + _stores(v) + _engine(v) + _tools(v)


def _stores(v: dict[str, Any]) -> list[Probe]:
    f, family = v["flow"], "memory stores, items, config, node memory"
    rows: list[Row] = []
    for store, item in ((v["store"], v["item"]), (v["board"], v["board_item"])):
        at = f"/api/v1/memory-stores/{store}"
        rows += [("GET", at), ("PATCH", at, {"config": {}}),
                 ("PATCH", at, {"config": {"max_items": 1}}), ("GET", f"{at}/items"),
                 ("GET", f"{at}/items?session_id=s1"), ("GET", f"{at}/items/{item}"),
                 ("DELETE", f"{at}/items/{item}"), ("POST", f"{at}/load"), ("DELETE", at)]  # fmt: skip
    for node in ("mem", "n1"):
        at = f"/api/v1/flows/{f}/nodes/{node}/memory"
        rows += [("GET", at), ("POST", f"{at}/retrieve", {"stage": "gen", "query": "word"}),
                 ("POST", f"{at}/write", {"input": "planted", "output": "A planted answer."})]  # fmt: skip
    out = _probes(family, rows)
    names = v["store_names"]
    refused: list[Row] = []
    for flow_ref in (f, v["flow_name"]):  # the victim's flow by id, then by name
        entry = {"id": "mem", "flow": flow_ref, "memories": [{"name": n} for n in names]}
        for query in ("", "?dry_run=true"):
            refused.append(
                ("POST", f"/api/v1/memory-config{query}", {"memory": [], "nodes": [entry]})
            )
    out += _probes(family, refused, expect="refused", status=400, check=_flow_refused)
    planted = {"memory": [{"name": n, "type": "blackboard", "config": {}} for n in names]}
    own = {"expect": "own", "allowed": (200,)}
    out += _probes(family, [("GET", "/api/v1/memory-config")], **own, check=_empty("memory"))
    out += _probes(family, [("GET", "/api/v1/memory-config?format=yaml")], **own)
    # The victim's store names, planned in the intruder's own namespace: new stores.
    out += _probes(family, [("POST", "/api/v1/memory-config?dry_run=true", planted)], **own,
                   check=_only_creates)  # fmt: skip
    return out


def _engine(v: dict[str, Any]) -> list[Probe]:
    fact, dream, family = v["fact"], v["dream"], "engine"
    summary = {"scope": SCOPE, "conversation": {"flow": v["flow"], "session_id": "s1"},
               "max_tokens": 50}  # fmt: skip
    rows: list[Row] = [("POST", f"/api/v1/engine/dreams/{dream}/undo", {}),
                       ("POST", "/api/v1/engine/summaries", summary)]  # fmt: skip
    for query in ("", f"?{SCOPE_QUERY}"):
        at = f"/api/v1/engine/facts/{fact}{query}"
        rows += [("GET", at), ("PATCH", at, {"content": "taken over"}), ("DELETE", at),
                 ("GET", f"/api/v1/engine/dreams/{dream}{query}")]  # fmt: skip
    out = _probes(family, rows)
    # The intruder's own scope user/u1 (not the victim's): its own, empty, answers.
    out += _probes(family, [
        ("GET", f"/api/v1/engine/facts?{SCOPE_QUERY}"),
        ("POST", "/api/v1/engine/search", {"scope": SCOPE, "query": "prefers"}),
        ("POST", "/api/v1/engine/injection", {"scope": SCOPE, "query": "prefers", "max_tokens": 500}),
        ("GET", f"/api/v1/engine/journal?{SCOPE_QUERY}"),
        ("GET", f"/api/v1/engine/journal?{SCOPE_QUERY}&date=2026-01-01"),
        ("GET", "/api/v1/engine/settings"),
        ("GET", f"/api/v1/engine/updates?{SCOPE_QUERY}"),
        ("GET", f"/api/v1/engine/dreams?{SCOPE_QUERY}"),
        ("POST", "/api/v1/engine/erase", {"scope": SCOPE}),
    ], expect="own")  # fmt: skip
    # Without an LLM: a flush and a dream are refused (503), whoever asks.
    flush = {"scope": SCOPE, "messages": [{"role": "user", "content": "hi"}]}
    out += _probes(family, [("POST", "/api/v1/engine/flush", flush),
                            ("POST", "/api/v1/engine/dream", {"scope": SCOPE})],
                   expect="own", allowed=(404, 503))  # fmt: skip
    return out


def _tools(v: dict[str, Any]) -> list[Probe]:
    fact, flow, family = v["fact"], v["flow"], "tools call"
    at = "/api/v1/tools"
    node = {"flow": flow, "node_id": "mem"}
    out = _probes(family, [
        ("POST", f"{at}/manage_memory/call",
         {"scope": SCOPE, "arguments": {"action": "delete", "id": fact}}),
        ("POST", f"{at}/manage_memory/call",
         {"scope": SCOPE, "arguments": {"action": "update", "id": fact, "content": "taken"}}),
        ("POST", f"{at}/retrieve_node_memory/call", {"arguments": {**node, "query": "word"}}),
        ("POST", f"{at}/write_node_memory/call",
         {"arguments": {**node, "input": "a", "output": "A planted answer, long enough."}}),
    ])  # fmt: skip
    out += _probes(family, [
        ("POST", f"{at}/search_memory/call", {"scope": SCOPE, "arguments": {"query": "prefers"}}),
        ("GET", at),
    ], expect="own", allowed=(200,))  # fmt: skip
    # The chat proxy with the memory tools, for the intruder's own end user "u1": no
    # LLM is configured here, so a 503 (and nothing of the victim's either way).
    chat = {"model": "m", "user": "u1", "messages": [{"role": "user", "content": "hi"}]}
    out += _probes(family, [("POST", "/v1/chat/completions", chat), ("GET", "/v1/models")],
                   expect="own", allowed=(200, 503))  # fmt: skip
    out += _probes("API keys", [("GET", f"/api/v1/api-keys/{v['key']}"),
                                ("DELETE", f"/api/v1/api-keys/{v['key']}")])  # fmt: skip
    out += _probes("API keys", [("GET", "/api/v1/me")], expect="own", allowed=(200,))
    return out


def _mcp(v: dict[str, Any]) -> list[Probe]:
    """JSON-RPC over ``POST /mcp`` with the intruder's key: tool calls on the victim's
    objects answer a tool error; the intruder's own scope, its own (empty) data."""
    flow, fact = v["flow"], v["fact"]
    tool = "tools/call"
    calls: list[tuple[str, dict[str, Any], str]] = [
        (tool, {"name": "manage_memory", "arguments": {"scope": SCOPE, "action": "delete",
                                                       "id": fact}}, "tool_error"),
        (tool, {"name": "manage_memory", "arguments": {"scope": SCOPE, "action": "update",
                                                       "id": fact, "content": "x"}}, "tool_error"),
        (tool, {"name": "retrieve_node_memory", "arguments": {"flow": flow, "node_id": "mem",
                                                              "query": "word"}}, "tool_error"),
        (tool, {"name": "write_node_memory", "arguments": {"flow": flow, "node_id": "mem",
                                                           "input": "a", "output": "planted"}},
         "tool_error"),
        ("resources/read", {"uri": "memory://scope/user,u1/MEMORY.md"}, "tool_error"),
        ("resources/read", {"uri": "memory://scope/user,u1/journal/2026-01-01.md"}, "tool_error"),
        (tool, {"name": "search_memory", "arguments": {"scope": SCOPE, "query": "prefers"}}, "own"),
        ("resources/list", {}, "own"),
        ("tools/list", {}, "own"),
    ]  # fmt: skip
    return [
        Probe("MCP (/mcp)", "POST", "/mcp",
              {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, expect,
              allowed=(200,))
        for method, params, expect in calls
    ]  # fmt: skip


def _problem(probe: Probe, reply: Reply, secret: str) -> str | None:
    """Why ``reply`` is wrong for ``probe``, or None."""
    text = json.dumps(reply.body) if not isinstance(reply.body, str) else reply.body
    if secret in text:
        return "the victim's secret is in the answer"
    if probe.expect == "404":
        return None if reply.status == 404 else f"expected 404, got {reply.status}"
    if probe.expect == "refused":
        if reply.status != probe.status:
            return f"expected {probe.status}"
        return probe.check(reply.body) if probe.check is not None else None
    if probe.expect == "tool_error":
        body = reply.body if isinstance(reply.body, dict) else {}
        refused = "error" in body or (body.get("result") or {}).get("isError") is True
        return None if reply.status == 200 and refused else "expected a JSON-RPC/tool error"
    if reply.status not in probe.allowed:
        return f"expected one of {probe.allowed}"
    return probe.check(reply.body) if probe.check is not None else None


LISTS = (
    "/api/v1/flows",
    "/api/v1/knowledge-bases",
    "/api/v1/memory-bases",
    "/api/v1/memories",
    "/api/v1/memory-stores",
    "/api/v1/global-memories",
    "/api/v1/messages",
    "/api/v1/api-keys",
)


def cross_tenant(inst: Instance) -> dict[str, Any]:
    """Run the sweep (see the module's docstring) and report it by endpoint family."""
    inst.wait_healthy(worker=False)
    secret = f"s3cr3t{uuid.uuid4().hex[:8]}"
    victim = _victim(inst, secret)
    intruder = inst.key_for(f"intruder-{uuid.uuid4().hex[:6]}")
    probes = _rest(victim) + _mcp(victim)
    probes += [Probe("lists", "GET", path, expect="own", allowed=(200,)) for path in LISTS]
    before = settled_digest(inst)
    statuses: Counter[int] = Counter()
    families: Counter[str] = Counter()
    wrong: list[str] = []
    for probe in probes:
        data = json.dumps(probe.body).encode() if probe.body is not None else None
        headers = MCP_HEADERS if probe.path == "/mcp" else {"Content-Type": "application/json"}
        reply = inst.raw(
            probe.method,
            quote(probe.path, safe="/?=&:"),
            data,
            dict(headers) if data is not None else {},
            key=intruder,
        )
        statuses[reply.status] += 1
        families[probe.family] += 1
        problem = _problem(probe, reply, secret)
        if probe.family == "lists" and problem is None:
            results = reply.body.get("results") if isinstance(reply.body, dict) else None
            expected = 1 if probe.path == "/api/v1/api-keys" else 0  # its own key
            if results is None or len(results) != expected:
                problem = f"{len(results or [])} results"
        if problem:
            wrong.append(
                f"{probe.method} {probe.path}: {reply.status} {problem}: {str(reply.body)[:100]}"
            )
    changed = _changed(before, settled_digest(inst))
    return {
        "requests": len(probes),
        "by_family": dict(families),
        "by_status": dict(sorted(statuses.items())),
        "wrong_answers": len(wrong),
        "wrong": wrong[:30],
        "tables_changed": changed,
    }
