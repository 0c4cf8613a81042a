"""The attacker's sections: hostile input and schemathesis (the cross-tenant sweep is
``tenancy.py``).

Each drives a served ``Instance`` (real gunicorn, real database) and returns figures:
how many answers were 5xx or not in the JSON error shape, what schemathesis found, and
whether one owner could see or change another's objects (row counts and a digest of
every project table, before and after).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from typing import Any

from scripts.faults.harness import Instance

# The tables a request could write to (the project's apps); django_q and sessions not.
TABLE_PREFIXES = ("core_", "knowledge_", "ingestion_", "memories_", "memory_", "stores_")
# The worker's own bookkeeping, which no request writes: its clusters' beats move every
# few seconds, its claims with the broker (core.worker_claims).
NOT_WRITTEN_BY_REQUESTS = {"core_workercluster", "core_workerclaim"}


def table_digest(inst: Instance) -> dict[str, str]:
    """Per project table: row count and an md5 of every row, to see any change."""
    tables = [
        row[0]
        for row in inst.query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
        if row[0].startswith(TABLE_PREFIXES) and row[0] not in NOT_WRITTEN_BY_REQUESTS
    ]
    out = {}
    for table in tables:
        # last_used_at moves on every authenticated request (coarsely): not a change.
        exclude = " - 'last_used_at'" if table == "core_apikey" else ""
        (row,) = inst.query(
            f"SELECT count(*), coalesce(md5(string_agg((to_jsonb(t){exclude})::text, '|' "
            f"ORDER BY (to_jsonb(t){exclude})::text)), '') FROM {table} t"
        )
        out[table] = f"{row[0]}:{row[1]}"
    return out


def _work_waiting(inst: Instance) -> int:
    """Tasks in the broker and jobs not finished (a knowledge base's runner works through
    its queued batches inside one task). Without a worker (serve --no-worker) nothing
    runs, so nothing is waited for."""
    if not inst.workers():
        return 0
    (row,) = inst.query(
        "SELECT (SELECT count(*) FROM django_q_ormq)"
        " + (SELECT count(*) FROM knowledge_ingestjob WHERE status IN ('queued', 'running'))"
        " + (SELECT count(*) FROM ingestion_ingestionjob WHERE status IN ('queued', 'running'))"
    )
    return int(row[0])


def settled_digest(inst: Instance, *, quiet: float = 1.5, bound: float = 300.0) -> dict[str, str]:
    """``table_digest`` once background work (indexing, Memory Base jobs, document
    batches earlier sections queued) is done: the broker empty and the digest still."""
    deadline = time.monotonic() + bound
    digest = table_digest(inst)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        again = table_digest(inst)
        if again == digest and not _work_waiting(inst):
            return digest
        digest = again
    return digest


def _changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(t for t in set(before) | set(after) if before.get(t) != after.get(t))


def _objects(inst: Instance) -> dict[str, Any]:
    """One of each kind of object, owned by the suite's user."""
    tag = uuid.uuid4().hex[:8]
    flow = inst.post("/api/v1/flows", {"name": f"atk-{tag}"}).body["id"]
    run = {
        "session_id": "s1",
        "messages": [
            {"role": "user", "content": "hello", "message_id": "m1"},
            {"role": "assistant", "content": "an answer worth keeping", "message_id": "m2"},
        ],
    }
    inst.post(f"/api/v1/flows/{flow}/runs", run)
    kb = inst.post("/api/v1/knowledge-bases", {"name": f"atk-{tag}"}).body["id"]
    inst.post(f"/api/v1/knowledge-bases/{kb}/documents", {"documents": [{"text": "tea facts"}]})
    mb = inst.post("/api/v1/memory-bases", {"name": f"atk-{tag}", "flow": flow}).body
    jobs = inst.post(f"/api/v1/memory-bases/{mb['id']}/flush", {}).body.get("jobs") or []
    added = inst.post(
        "/api/v1/users/u1/memories", {"content": f"likes green tea {tag}", "infer": False}
    )
    stored = (added.body.get("memories") or added.body.get("duplicates") or [None])[0]
    assert stored, f"POST /users/u1/memories: {added.status} {added.body}"
    memory = stored["id"]
    global_memory = inst.post("/api/v1/global-memories", {"content": f"opens at 9 {tag}"}).body
    turn = {"flow": flow, "message_id": "t1", "user_content": "hi", "assistant_content": "hey"}
    inst.post("/api/v1/conversations/s1/nodes/n1/turns", turn)
    store = inst.post(
        "/api/v1/memory-stores", {"name": f"atk-{tag}", "type": "simple", "config": {}}
    ).body
    fact = (
        inst.post(
            "/api/v1/engine/facts", {"scope": ["user", "u1"], "content": f"prefers tea {tag}"}
        ).body.get("fact")
        or {}
    )
    # A key of its own for the sweeps to aim at (schemathesis DELETEs what it is given).
    key = inst.post("/api/v1/api-keys", {"name": f"target-{tag}"}).body["id"]
    return {
        "flow": flow,
        "kb": kb,
        "mb": mb["id"],
        "mb_kb": mb["knowledge_base"],
        "job": jobs[0]["id"] if jobs else str(uuid.uuid4()),
        "memory": memory,
        "global_memory": global_memory.get("id", str(uuid.uuid4())),
        "store": store.get("id", str(uuid.uuid4())),
        "key": key,
        "fact": fact.get("id", str(uuid.uuid4())),
    }


# --- hostile input ---------------------------------------------------------------------
NUL, SURROGATE = "a\u0000b", "a\ud800b"


def _hostile_requests(ids: dict[str, Any]) -> list[tuple[str, str, str, bytes | None, dict]]:
    """(label, method, path, body, headers): at least 100 requests no client should send."""
    flow, kb, mb = ids["flow"], ids["kb"], ids["mb"]
    json_h = {"Content-Type": "application/json"}
    writes = [
        ("runs", "POST", f"/api/v1/flows/{flow}/runs", "run"),
        ("message", "POST", "/api/v1/messages", "message"),
        ("documents", "POST", f"/api/v1/knowledge-bases/{kb}/documents", "documents"),
        ("user-memory", "POST", "/api/v1/users/u1/memories", "memory"),
        ("kb-search", "POST", f"/api/v1/knowledge-bases/{kb}/search", "search"),
        ("search", "POST", "/api/v1/search", "search"),
        ("kb-create", "POST", "/api/v1/knowledge-bases", "kb"),
        ("flow-create", "POST", "/api/v1/flows", "flow"),
        ("engine-fact", "POST", "/api/v1/engine/facts", "fact"),
        ("engine-search", "POST", "/api/v1/engine/search", "engine-search"),
        ("node-turn", "POST", "/api/v1/conversations/s1/nodes/n1/turns", "turn"),
        ("chat", "POST", "/v1/chat/completions", "chat"),
        ("mb-flush", "POST", f"/api/v1/memory-bases/{mb}/flush", "flush"),
        ("kb-patch", "PATCH", f"/api/v1/knowledge-bases/{kb}", "patch"),
    ]

    def body(kind: str, text: Any = "hello", extra: dict | None = None) -> Any:
        shapes = {
            "run": {"session_id": "s9", "messages": [{"role": "user", "content": text}]},
            "message": {"flow": flow, "session_id": "s9", "role": "user", "content": text},
            "documents": {"documents": [{"text": text, "metadata": {"k": text}}]},
            "memory": {"content": text, "infer": False, "metadata": {"k": text}},
            "search": {"query": text, "filters": {"session_id": text}},
            "kb": {"name": text},
            "flow": {"name": text},
            "fact": {"scope": ["user", "u1"], "content": text},
            "engine-search": {"scope": ["user", "u1"], "query": text},
            "turn": {
                "flow": flow,
                "message_id": "h1",
                "user_content": text,
                "assistant_content": text,
            },
            "chat": {"model": "m", "messages": [{"role": "user", "content": text}]},
            "flush": {"session_id": text},
            "patch": {"description": text},
        }
        return {**shapes[kind], **(extra or {})}

    deep = "[" * 1000 + "]" * 1000
    out: list[tuple[str, str, str, bytes | None, dict]] = []
    for label, method, path, kind in writes:
        variants: list[tuple[str, bytes]] = [
            ("nul", json.dumps(body(kind, NUL)).encode()),
            ("nul-key", json.dumps(body(kind, "x", {NUL: 1})).encode()),
            ("surrogate", json.dumps(body(kind, SURROGATE)).encode()),
            ("deep-1000", json.dumps(body(kind)).encode()[:-1] + b', "x": ' + deep.encode() + b"}"),
            ("invalid-json", b'{"a": '),
            ("not-utf8", b'{"name": "\xff\xfe"}'),
            ("array-body", b"[1, 2, 3]"),
            ("huge-number", json.dumps(body(kind, "@@")).replace('"@@"', "1e999").encode()),
        ]
        for name, data in variants:
            out.append((f"{label}/{name}", method, path, data, json_h))
    vector = {"mode": "vector"}
    out += [
        (
            "vector/zero",
            "POST",
            f"/api/v1/knowledge-bases/{kb}/search",
            json.dumps({**vector, "vector": [0.0] * 384}).encode(),
            json_h,
        ),
        (
            "vector/1e39",
            "POST",
            "/api/v1/search",
            json.dumps({**vector, "vector": [1e39] * 384}).encode(),
            json_h,
        ),
        (
            "vector/tiny",
            "POST",
            "/api/v1/search",
            json.dumps({**vector, "vector": [1e-45] * 384}).encode(),
            json_h,
        ),
        (
            "vector/wrong-dims",
            "POST",
            "/api/v1/search",
            json.dumps({**vector, "vector": [0.1] * 3}).encode(),
            json_h,
        ),
        (
            "kb/chunk_size-80",
            "POST",
            "/api/v1/knowledge-bases",
            json.dumps({"name": "tiny", "chunk_size": 80}).encode(),
            json_h,
        ),
        ("kb/delete-memory-base-kb", "DELETE", f"/api/v1/knowledge-bases/{ids['mb_kb']}", None, {}),
        ("query/nul", "GET", "/api/v1/messages?session_id=a%00b", None, {}),
        (
            "query/1001-params",
            "GET",
            "/api/v1/flows?" + "&".join(f"p{i}=1" for i in range(1001)),
            None,
            {},
        ),
        ("query/page-0", "GET", "/api/v1/flows?page=0", None, {}),
        ("query/page-size-huge", "GET", "/api/v1/flows?page_size=99999999999999999999", None, {}),
        ("query/top_k-text", "GET", "/api/v1/users/u1/memories/search?q=tea&top_k=ten", None, {}),
        ("path/nul", "GET", "/api/v1/users/a%00b/memories", None, {}),
        ("path/bad-uuid", "GET", "/api/v1/flows/not-a-uuid", None, {}),
        ("path/bad-session", "DELETE", f"/api/v1/flows/{flow}/sessions/-x%20y/messages", None, {}),
        ("path/long-url", "GET", "/api/v1/flows?q=" + "x" * 5000, None, {}),
        ("path/dot-dot", "GET", "/api/v1/../../etc/passwd", None, {}),
        ("auth/0xa0", "GET", "/api/v1/me", None, {"Authorization": "\xa0"}),
        ("auth/0x85", "GET", "/api/v1/me", None, {"Authorization": "\x85"}),
        ("auth/bearer-only", "GET", "/api/v1/me", None, {"Authorization": "Bearer"}),
        ("auth/three-parts", "GET", "/api/v1/me", None, {"Authorization": "Bearer a b"}),
        ("auth/basic", "GET", "/api/v1/me", None, {"Authorization": "Basic Zm9vOmJhcg=="}),
        ("auth/huge-key", "GET", "/api/v1/me", None, {"Authorization": "Bearer " + "k" * 6000}),
        ("header/huge", "GET", "/api/v1/me", None, {"X-Junk": "y" * 9000}),
        (
            "content-type/xml",
            "POST",
            "/api/v1/flows",
            b"<flow/>",
            {"Content-Type": "application/xml"},
        ),
        (
            "content-type/form-nul",
            "POST",
            "/api/v1/flows",
            b"name=a%00b",
            {"Content-Type": "application/x-www-form-urlencoded"},
        ),
        (
            "content-length/lie",
            "POST",
            "/api/v1/flows",
            b"{}",
            {"Content-Type": "application/json", "X-Claim": "1"},
        ),
        ("method/put", "PUT", "/api/v1/flows", b"{}", json_h),
        ("method/trace", "TRACE", "/api/v1/flows", None, {}),
        (
            "bool/background-string",
            "POST",
            f"/api/v1/knowledge-bases/{kb}/documents",
            json.dumps({"documents": [{"text": "x"}], "background": "false"}).encode(),
            json_h,
        ),
        (
            "bool/infer-string",
            "POST",
            "/api/v1/users/u1/memories",
            json.dumps({"content": "x", "infer": "false"}).encode(),
            json_h,
        ),
        (
            "bool/include-memory-bases-string",
            "POST",
            "/api/v1/search",
            json.dumps({"query": "x", "include_memory_bases": "yes"}).encode(),
            json_h,
        ),
        (
            "metadata/infinity",
            "POST",
            f"/api/v1/knowledge-bases/{kb}/documents",
            b'{"documents": [{"text": "x", "metadata": {"k": 1e999}}]}',
            json_h,
        ),
        (
            "metadata/nan-literal",
            "POST",
            f"/api/v1/knowledge-bases/{kb}/documents",
            b'{"documents": [{"text": "x", "metadata": {"k": NaN}}]}',
            json_h,
        ),
        (
            "chat/stream-string",
            "POST",
            "/v1/chat/completions",
            json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "false"}
            ).encode(),
            json_h,
        ),
        ("chat/no-messages", "POST", "/v1/chat/completions", b'{"model": "m"}', json_h),
        (
            "chat/bad-user",
            "POST",
            "/v1/chat/completions",
            json.dumps(
                {"model": "m", "user": "bad id!", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            json_h,
        ),
        (
            "config/yaml-bomb",
            "POST",
            "/api/v1/memory-config",
            b"a: &a [" + b"*a," * 50 + b"]",
            {"Content-Type": "application/yaml"},
        ),
        (
            "config/yaml-deep",
            "POST",
            "/api/v1/memory-config",
            b"x: " + b"[" * 2000 + b"]" * 2000,
            {"Content-Type": "application/yaml"},
        ),
        (
            "config/yaml-python-tag",
            "POST",
            "/api/v1/memory-config",
            b"x: !!python/object/apply:os.system ['true']",
            {"Content-Type": "application/yaml"},
        ),
        ("config/format-empty", "GET", "/api/v1/memory-config?format=", None, {}),
    ]
    return out


def hostile_input(inst: Instance) -> dict[str, Any]:
    """At least 100 hostile requests (NUL, lone surrogates, 1,000-deep JSON, overflowing
    vectors, malformed auth headers, long URLs, YAML tricks, wrong types, ...) against a
    served instance: every answer must be a 4xx in the JSON error shape, and the
    database must be unchanged."""
    inst.wait_healthy(worker=False)
    ids = _objects(inst)
    requests = _hostile_requests(ids)
    first = before = settled_digest(inst)
    outcomes: Counter[str] = Counter()
    bad: list[str] = []
    writers: list[str] = []
    for label, method, path, data, headers in requests:
        try:
            reply = inst.raw(method, path, data, headers)
        except OSError as exc:
            outcomes["connection error"] += 1
            bad.append(f"{label}: {type(exc).__name__}")
            continue
        outcomes[str(reply.status)] += 1
        if reply.status >= 500 or (reply.status >= 400 and not reply.json_shape):
            bad.append(f"{label}: {reply.status} {str(reply.body)[:80]}")
        now = table_digest(inst)
        if now != before:  # name the request that wrote
            writers.append(f"{label}: {reply.status} {', '.join(_changed(before, now))}")
            before = now
    changed = _changed(first, settled_digest(inst))
    return {
        "requests": len(requests),
        "by_status": dict(sorted(outcomes.items())),
        "server_errors_5xx": sum(n for s, n in outcomes.items() if s.startswith("5")),
        "not_json_error_shape_or_5xx": len(bad),
        "bad": bad[:20],
        "tables_changed": changed,
        "requests_that_wrote": writers,
    }


# --- schemathesis ----------------------------------------------------------------------
def schemathesis_run(inst: Instance, *, examples: int = 10) -> dict[str, Any]:
    """Schemathesis over every operation of the served /api/schema/ (positive and
    negative data, plus a pass on existing objects), every check: 5xx and violations."""
    import schemathesis

    from scripts.faults.fuzz import fuzz

    inst.wait_healthy(worker=False)
    ids = _objects(inst)
    schema = schemathesis.openapi.from_url(inst.base_url + "/api/schema/")
    report = fuzz(
        schema,
        headers={"Authorization": f"Bearer {inst.ensure_key()}"},
        max_examples=examples,
        base_url=inst.base_url,
        known_ids={
            "flow_id": ids["flow"],
            "mb_id": ids["mb"],
            "kb_id": ids["kb"],
            "session_id": "s1",
            "node_id": "n1",
            "user_id": "u1",
            "memory_id": ids["memory"],
            "key_id": ids["key"],
            "store_id": ids["store"],
        },
    )
    figures = report.figures()
    figures["failures_listed"] = [
        f"{op}: {title}" for op, titles in sorted(report.failures.items()) for title in titles
    ][:20]
    # One request per failure (its curl and the answer's start), to reproduce it.
    figures["failing_requests"] = list(report.examples.values())[:20]
    return figures
