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
    kb_job = (docs.get("job") or docs).get("id")
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
        "from memories.personal.models import EndUser\n"
        "u = EndUser.objects.get(owner__username='fault', scope=['user', 'u1'])\n"
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


def _rest(v: dict[str, Any]) -> list[Probe]:
    f, kb, mb, job = v["flow"], v["kb"], v["mb"], v["job"]
    out: list[Probe] = []
    for prefix in ("memory-bases", "memories"):
        family = "memory bases and sessions"
        out += [
            Probe(family, "GET", f"/api/v1/{prefix}/{mb}"),
            Probe(family, "PATCH", f"/api/v1/{prefix}/{mb}", {"name": "taken over"}),
            Probe(family, "GET", f"/api/v1/{prefix}/{mb}/sessions"),
            Probe(family, "POST", f"/api/v1/{prefix}/{mb}/flush", {}),
            Probe(family, "POST", f"/api/v1/{prefix}/{mb}/update", {}),
            Probe(family, "POST", f"/api/v1/{prefix}/{mb}/regenerate", {}),
            Probe(family, "DELETE", f"/api/v1/{prefix}/{mb}"),
        ]
    out.append(
        Probe(
            "memory bases and sessions",
            "POST",
            "/api/v1/memory-bases",
            {"name": "stolen", "flow": f},
        )
    )
    for base in (kb, v["mb_kb"]):
        family = "knowledge bases, documents, search"
        out += [
            Probe(family, "GET", f"/api/v1/knowledge-bases/{base}"),
            Probe(family, "PATCH", f"/api/v1/knowledge-bases/{base}", {"name": "taken over"}),
            Probe(family, "GET", f"/api/v1/knowledge-bases/{base}/chunks"),
            Probe(family, "GET", f"/api/v1/knowledge-bases/{base}/chunks?session_id=s1"),
            Probe(family, "GET", f"/api/v1/knowledge-bases/{base}/chunks?flow_id={f}"),
            Probe(
                family,
                "POST",
                f"/api/v1/knowledge-bases/{base}/documents",
                {"documents": [{"text": "planted"}]},
            ),
            Probe(family, "POST", f"/api/v1/knowledge-bases/{base}/search", {"query": "tea"}),
            Probe(
                family,
                "POST",
                f"/api/v1/knowledge-bases/{base}/search",
                {"query": "tea", "mode": "vector"},
            ),
            Probe(
                family,
                "POST",
                f"/api/v1/knowledge-bases/{base}/search",
                {"query": "tea", "mode": "keyword"},
            ),
            Probe(family, "GET", f"/api/v1/knowledge-bases/{base}/jobs/{v['kb_job']}"),
            Probe(family, "GET", f"/api/v1/knowledge-bases/{base}/jobs/{job}"),
            Probe(family, "DELETE", f"/api/v1/knowledge-bases/{base}"),
        ]
    out += [
        Probe(
            "knowledge bases, documents, search",
            "POST",
            "/api/v1/search",
            {"query": "tea", "knowledge_base_ids": [kb, v["mb_kb"]]},
        ),
        Probe("jobs", "GET", f"/api/v1/jobs/{job}"),
        Probe("jobs", "GET", f"/api/v1/jobs/{v['kb_job']}"),
    ]
    family = "flows, runs, messages, conversations"
    out += [
        Probe(family, "GET", f"/api/v1/flows/{f}"),
        Probe(
            family,
            "POST",
            f"/api/v1/flows/{f}/runs",
            {"session_id": "s1", "messages": [{"role": "user", "content": "x"}]},
        ),
        Probe(
            family,
            "POST",
            "/api/v1/messages",
            {"flow": f, "session_id": "s1", "role": "user", "content": "x"},
        ),
        Probe(family, "GET", f"/api/v1/messages?flow={f}"),
        Probe(family, "GET", f"/api/v1/messages?flow={f}&session_id=s1"),
        Probe(family, "GET", f"/api/v1/messages?memory_base_id={mb}"),
        Probe(family, "DELETE", f"/api/v1/flows/{f}/sessions/s1/messages"),
        Probe(family, "GET", f"/api/v1/conversations/s1/history?flow={f}"),
        Probe(family, "GET", f"/api/v1/conversations/s1/nodes/n1/history?flow={f}"),
        Probe(
            family,
            "POST",
            "/api/v1/conversations/s1/nodes/n1/turns",
            {"flow": f, "message_id": "x1", "user_content": "a", "assistant_content": "b"},
        ),
        Probe(family, "DELETE", f"/api/v1/conversations/s1/nodes/n1?flow={f}"),
    ]
    memory, family = v["memory"], "users' memories"
    out += [
        Probe(family, "GET", f"/api/v1/users/u1/memories/{memory}"),
        Probe(family, "PATCH", f"/api/v1/users/u1/memories/{memory}", {"content": "taken"}),
        Probe(family, "GET", f"/api/v1/users/u1/memories/{memory}/history"),
        Probe(family, "DELETE", f"/api/v1/users/u1/memories/{memory}"),
        Probe(family, "GET", f"/api/v1/users/u2/memories/{memory}"),
        Probe(family, "PATCH", f"/api/v1/users/u2/memories/{memory}", {"content": "taken"}),
        Probe(family, "DELETE", f"/api/v1/users/u2/memories/{memory}"),
        Probe(family, "DELETE", f"/api/v1/global-memories/{v['global_memory']}"),
        # The intruder's own end user "u1" (another person than the victim's "u1").
        Probe(
            family,
            "GET",
            "/api/v1/users/u1/memories",
            expect="own",
            allowed=(200,),
            check=_empty("results"),
        ),
        Probe(
            family,
            "GET",
            "/api/v1/users/u1/memories/search?q=likes",
            expect="own",
            allowed=(200,),
            check=_empty("results"),
        ),
        Probe(family, "DELETE", "/api/v1/users/u1/memories", expect="own"),
    ]
    return out + _stores(v) + _engine(v)


def _stores(v: dict[str, Any]) -> list[Probe]:
    f, family = v["flow"], "memory stores, items, config, node memory"
    out: list[Probe] = []
    for store, item in ((v["store"], v["item"]), (v["board"], v["board_item"])):
        out += [
            Probe(family, "GET", f"/api/v1/memory-stores/{store}"),
            Probe(family, "PATCH", f"/api/v1/memory-stores/{store}", {"config": {}}),
            Probe(family, "PATCH", f"/api/v1/memory-stores/{store}", {"config": {"max_items": 1}}),
            Probe(family, "GET", f"/api/v1/memory-stores/{store}/items"),
            Probe(family, "GET", f"/api/v1/memory-stores/{store}/items?session_id=s1"),
            Probe(family, "GET", f"/api/v1/memory-stores/{store}/items/{item}"),
            Probe(family, "DELETE", f"/api/v1/memory-stores/{store}/items/{item}"),
            Probe(family, "POST", f"/api/v1/memory-stores/{store}/load"),
            Probe(family, "DELETE", f"/api/v1/memory-stores/{store}"),
        ]
    names = v["store_names"]
    for flow_ref in (f, v["flow_name"]):  # the victim's flow by id, then by name
        node = {"id": "mem", "flow": flow_ref, "memories": [{"name": n} for n in names]}
        for query in ("", "?dry_run=true"):
            out.append(
                Probe(
                    family,
                    "POST",
                    f"/api/v1/memory-config{query}",
                    {"memory": [], "nodes": [node]},
                    "refused",
                    400,
                    check=_flow_refused,
                )
            )
    planted = {"memory": [{"name": n, "type": "blackboard", "config": {}} for n in names]}
    out += [
        Probe(
            family,
            "GET",
            "/api/v1/memory-config",
            expect="own",
            allowed=(200,),
            check=_empty("memory"),
        ),
        Probe(family, "GET", "/api/v1/memory-config?format=yaml", expect="own", allowed=(200,)),
        # The victim's store names, planned in the intruder's own namespace: new stores.
        Probe(
            family,
            "POST",
            "/api/v1/memory-config?dry_run=true",
            planted,
            "own",
            allowed=(200,),
            check=_only_creates,
        ),
    ]
    for node in ("mem", "n1"):
        out += [
            Probe(family, "GET", f"/api/v1/flows/{f}/nodes/{node}/memory"),
            Probe(
                family,
                "POST",
                f"/api/v1/flows/{f}/nodes/{node}/memory/retrieve",
                {"stage": "gen", "query": "word"},
            ),
            Probe(
                family,
                "POST",
                f"/api/v1/flows/{f}/nodes/{node}/memory/write",
                {"input": "planted question", "output": "A planted answer, long enough."},
            ),
        ]
    return out


def _engine(v: dict[str, Any]) -> list[Probe]:
    fact, dream, family = v["fact"], v["dream"], "engine"
    own = {"expect": "own"}
    out = [
        Probe(family, "GET", f"/api/v1/engine/facts/{fact}"),
        Probe(family, "GET", f"/api/v1/engine/facts/{fact}?{SCOPE_QUERY}"),
        Probe(family, "PATCH", f"/api/v1/engine/facts/{fact}", {"content": "taken over"}),
        Probe(family, "PATCH", f"/api/v1/engine/facts/{fact}?{SCOPE_QUERY}", {"content": "x"}),
        Probe(family, "DELETE", f"/api/v1/engine/facts/{fact}"),
        Probe(family, "DELETE", f"/api/v1/engine/facts/{fact}?{SCOPE_QUERY}"),
        Probe(family, "GET", f"/api/v1/engine/dreams/{dream}"),
        Probe(family, "GET", f"/api/v1/engine/dreams/{dream}?{SCOPE_QUERY}"),
        Probe(family, "POST", f"/api/v1/engine/dreams/{dream}/undo", {}),
        Probe(
            family,
            "POST",
            "/api/v1/engine/summaries",
            {
                "scope": SCOPE,
                "conversation": {"flow": v["flow"], "session_id": "s1"},
                "max_tokens": 50,
            },
        ),
        # The intruder's own scope user/u1 (not the victim's): its own, empty, answers.
        Probe(family, "GET", f"/api/v1/engine/facts?{SCOPE_QUERY}", **own),
        Probe(family, "POST", "/api/v1/engine/search", {"scope": SCOPE, "query": "prefers"}, **own),
        Probe(
            family,
            "POST",
            "/api/v1/engine/injection",
            {"scope": SCOPE, "query": "prefers", "max_tokens": 500},
            **own,
        ),
        Probe(family, "GET", f"/api/v1/engine/journal?{SCOPE_QUERY}", **own),
        Probe(family, "GET", f"/api/v1/engine/journal?{SCOPE_QUERY}&date=2026-01-01", **own),
        Probe(family, "GET", "/api/v1/engine/settings", **own),
        Probe(
            family,
            "POST",
            "/api/v1/engine/flush",
            {"scope": SCOPE, "messages": [{"role": "user", "content": "hi"}]},
            "own",
            allowed=(503,),
        ),
        Probe(family, "GET", f"/api/v1/engine/updates?{SCOPE_QUERY}", **own),
        Probe(family, "GET", f"/api/v1/engine/dreams?{SCOPE_QUERY}", **own),
        Probe(family, "POST", "/api/v1/engine/erase", {"scope": SCOPE}, **own),
        Probe(family, "POST", "/api/v1/engine/dream", {"scope": SCOPE}, "own", allowed=(404, 503)),
    ]
    family = "tools call"
    scoped = {"scope": SCOPE}
    out += [
        Probe(
            family,
            "POST",
            "/api/v1/tools/manage_memory/call",
            {**scoped, "arguments": {"action": "delete", "id": fact}},
        ),
        Probe(
            family,
            "POST",
            "/api/v1/tools/manage_memory/call",
            {**scoped, "arguments": {"action": "update", "id": fact, "content": "taken"}},
        ),
        Probe(
            family,
            "POST",
            "/api/v1/tools/retrieve_node_memory/call",
            {"arguments": {"flow": v["flow"], "node_id": "mem", "query": "word"}},
        ),
        Probe(
            family,
            "POST",
            "/api/v1/tools/write_node_memory/call",
            {
                "arguments": {
                    "flow": v["flow"],
                    "node_id": "mem",
                    "input": "a",
                    "output": "A planted answer, long enough.",
                }
            },
        ),
        Probe(
            family,
            "POST",
            "/api/v1/tools/search_memory/call",
            {**scoped, "arguments": {"query": "prefers"}},
            "own",
            allowed=(200,),
        ),
        Probe(family, "GET", "/api/v1/tools", expect="own", allowed=(200,)),
        # The chat proxy with the memory tools, for the intruder's own end user "u1": no
        # LLM is configured here, so a 503 (and nothing of the victim's either way).
        Probe(
            family,
            "POST",
            "/v1/chat/completions",
            {"model": "m", "user": "u1", "messages": [{"role": "user", "content": "hi"}]},
            "own",
            allowed=(503,),
        ),
        Probe(family, "GET", "/v1/models", expect="own", allowed=(200, 503)),
        Probe("API keys", "GET", f"/api/v1/api-keys/{v['key']}"),
        Probe("API keys", "DELETE", f"/api/v1/api-keys/{v['key']}"),
        Probe("API keys", "GET", "/api/v1/me", expect="own", allowed=(200,)),
    ]
    return out


def _mcp(v: dict[str, Any]) -> list[Probe]:
    """JSON-RPC over ``POST /mcp`` with the intruder's key: tool calls on the victim's
    objects answer a tool error; the intruder's own scope, its own (empty) data."""

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }

    flow, fact, family = v["flow"], v["fact"], "MCP (/mcp)"
    uri = "memory://scope/user,u1/MEMORY.md"
    return [
        Probe(
            family,
            "POST",
            "/mcp",
            call("manage_memory", {"scope": SCOPE, "action": "delete", "id": fact}),
            "tool_error",
        ),
        Probe(
            family,
            "POST",
            "/mcp",
            call("manage_memory", {"scope": SCOPE, "action": "update", "id": fact, "content": "x"}),
            "tool_error",
        ),
        Probe(
            family,
            "POST",
            "/mcp",
            call("retrieve_node_memory", {"flow": flow, "node_id": "mem", "query": "word"}),
            "tool_error",
        ),
        Probe(
            family,
            "POST",
            "/mcp",
            call(
                "write_node_memory",
                {"flow": flow, "node_id": "mem", "input": "a", "output": "planted answer"},
            ),
            "tool_error",
        ),
        Probe(
            family,
            "POST",
            "/mcp",
            {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": uri}},
            "tool_error",
        ),
        Probe(
            family,
            "POST",
            "/mcp",
            call("search_memory", {"scope": SCOPE, "query": "prefers"}),
            "own",
            allowed=(200,),
        ),
        Probe(
            family,
            "POST",
            "/mcp",
            {"jsonrpc": "2.0", "id": 1, "method": "resources/list"},
            "own",
            allowed=(200,),
        ),
        Probe(
            family,
            "POST",
            "/mcp",
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            "own",
            allowed=(200,),
        ),
        Probe(
            family,
            "POST",
            "/mcp",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "resources/read",
                "params": {"uri": "memory://scope/user,u1/journal/2026-01-01.md"},
            },
            "tool_error",
        ),
    ]


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
    "/api/v1/users/u1/memories",
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
