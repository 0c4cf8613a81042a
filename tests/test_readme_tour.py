"""The README's and docs' blocks, run as written against one `manage.py serve`.

One served instance for the module (its own database, ``EMBEDDED_DB_NAME``), the chat
LLM and the embedding endpoint a store names the scripted fake on 127.0.0.1. Per page,
the shell blocks (``<!-- run: ID -->``, see ``tests/readme.py``) run in order in one bash,
after the README's ``setup`` block, in a directory laid out like a checkout; then the
page's Python blocks that talk to the service run in process, in one namespace, with
``MEMORY_URL`` and ``MEMORY_API_KEY`` set. Each block's output goes to its check below:
a served block without a check fails its page.

Only the environment differs from a fresh machine: the instance's port (``URL``, which
the setup block reads with a default), its database, and the fake model.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from core.db_backend.base import embedded_server
from core.providers.embeddings import HashingEmbedder
from scripts.openwebui import demo_llm
from tests.core.test_serve import _free_port, _serve, _stop, _wait_healthy
from tests.fakes.openai_server import FakeOpenAIServer, Scripted, chat_body
from tests.readme import (
    DOCS,
    README,
    ROOT,
    Block,
    page_blocks,
    run_shell,
    workdir_like_a_checkout,
)

pytestmark = pytest.mark.slow
SAID = "I drink green tea every morning."
FACT = "User drinks green tea every morning"
ANSWER = "Noted: green tea every morning."
TEA = "Remember I prefer tea."
RESTORED_DB = "memory_restored"  # docs/operations.md restores a backup into it


@dataclass
class Served:
    base: str
    env: dict[str, str]
    workdir: Path
    llm: FakeOpenAIServer
    key: str = ""  # an API key of alice, for the checks' own requests
    printed: dict[str, str] = field(default_factory=dict)

    def get(self, path: str, key: str | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.base + path, headers={"Authorization": f"Bearer {key or self.key}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def until(self, path: str, done: Callable[[Any], bool], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            body = self.get(path)[1]
            if done(body) or time.monotonic() > deadline:
                return body
            time.sleep(0.3)


# --- the scripted model ------------------------------------------------------------------
def _tool_call(name: str, arguments: dict) -> Scripted:
    body = chat_body("")
    call = {"id": "call_1", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
    body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
    body["choices"][0]["finish_reason"] = "tool_calls"
    return Scripted(body=body)


def _model(payload: dict) -> Scripted:
    """The tour's chat gets its answer; a chat offering the memory tools asked to remember
    calls manage_memory, then answers; everything else (extractions: the user's
    first-person sentences as facts; summaries; other chats) is the Open WebUI demo's
    scripted model."""
    messages = payload["messages"]
    last = messages[-1]
    tools = [t["function"]["name"] for t in payload.get("tools") or []]
    if last.get("content") == SAID:
        return Scripted(body=chat_body(ANSWER))
    if last.get("content") == TEA and "manage_memory" in tools:
        return _tool_call(
            "manage_memory", {"content": "User prefers tea", "category": "preference"}
        )
    if last.get("role") == "tool":
        return Scripted(body=chat_body("Noted: you prefer tea."))
    return Scripted(body=chat_body(demo_llm.answer(payload)))


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs against the embedded server; DATABASE_URL is set")
    llm = FakeOpenAIServer()
    llm.chat_fn = _model
    wide = HashingEmbedder(dimensions=1536)  # text-embedding-3-small's size
    llm.embed_fn = lambda texts: wide.embed(texts).tolist()
    llm.start()
    dbname = f"docs_{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update(
        EMBEDDED_DB_NAME=dbname, PORT=str(_free_port()), ADMIN_PASSWORD="docs-password",
        LLM_BASE_URL=llm.base_url, LLM_MODEL="fake-model", LLM_API_KEY="sk-test",
        # Facts are learned once a user's messages pause (30 s by default): at once here.
        MEMORY_UPDATE_DEBOUNCE_SECONDS="0",
        MEMORY_STORE_FILE_ROOTS=str(ROOT),  # docs/memory-stores.md's file store reads docs/
        OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="sk-test",  # and its embedding block
    )  # fmt: skip
    _drop_databases(RESTORED_DB)  # left by a run that was killed before its clean-up
    proc = _serve(env)
    base = f"http://127.0.0.1:{env['PORT']}"
    try:
        _wait_healthy(base, proc)
        workdir = workdir_like_a_checkout(tmp_path_factory.mktemp("docs") / "checkout")
        yield Served(base=base, env={**env, "URL": base}, workdir=workdir, llm=llm)
    finally:
        _stop(proc)
        llm.stop()
        _drop_databases(dbname, RESTORED_DB)


def _drop_databases(*names: str) -> None:
    db = settings.DATABASES["default"]
    embedded_server(db)  # its HOST and PORT are filled on a process's first connection
    with psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db.get("OWNER_USER") or db["USER"],
        dbname="postgres",
        autocommit=True,
    ) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- running a page ------------------------------------------------------------------------
CHECKS: dict[str, Callable[[Served, str], None]] = {}


def check(run_id: str) -> Callable:
    def register(fn: Callable[[Served, str], None]) -> Callable[[Served, str], None]:
        CHECKS[run_id] = fn
        return fn

    return register


def _setup_block() -> Block:
    return next(b for b in page_blocks(README) if b.kind == "run" and b.name == "setup")


def _run_page(served: Served, page: Path) -> dict[str, str]:
    blocks = [b for b in page_blocks(page) if b.kind in {"run", "file"}]
    shell = [b for b in blocks if b.language == "sh" or b.kind == "file"]
    if page != README:
        shell = [_setup_block(), *shell]
    printed = run_shell(shell, cwd=served.workdir, env=served.env) if shell else {}
    if page != README:
        assert printed.pop("setup", "") == ""
    python = [b for b in blocks if b.language == "python" and b.name in CHECKS]
    if python:
        printed |= _run_python(served, python)
    return printed


def _run_python(served: Served, blocks: list[Block]) -> dict[str, str]:
    served.key = served.key or _new_key(served)
    namespace: dict[str, Any] = {"__name__": "docs"}
    printed = {}
    saved = {k: os.environ.get(k) for k in ("MEMORY_URL", "MEMORY_API_KEY")}
    os.environ.update(MEMORY_URL=served.base, MEMORY_API_KEY=served.key)
    try:
        for block in blocks:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(block.text, block.where, "exec"), namespace)
            printed[block.name] = out.getvalue().strip("\n")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return printed


def _new_key(served: Served) -> str:
    """Another key for alice, made the way the setup block makes one."""
    made = subprocess.run(
        [".venv/bin/python", "manage.py", "create_api_key", "alice", "--create-user"],
        cwd=served.workdir, env=served.env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return made.stdout.strip().splitlines()[-1]


# The README first: the tour expects alice to have no memories yet. Then the README
# again, as a reader who runs it twice would (new names where names must be unique, the
# same answers where what it stores is stored already), before the other pages.
PAGES = [(README, False), (README, True), *((p, False) for p in sorted(DOCS.glob("*.md")))]


@pytest.mark.parametrize(
    ("page", "second"), PAGES, ids=[p.name + (" again" if again else "") for p, again in PAGES]
)
def test_the_page_runs_as_written(served, page, second):
    served.key = served.key or _new_key(served)
    run_ids = [
        b.name
        for b in page_blocks(page)
        if b.kind == "run" and (b.language == "sh" or b.name in CHECKS)
    ]
    missing = [name for name in run_ids if name not in CHECKS]
    assert missing == [], f"served blocks of {page.name} without a check: {missing}"
    printed = _run_page(served, page)
    assert sorted(printed) == sorted(run_ids)
    for name in run_ids:
        check_of = CHECKS[name]
        if second and "second" in inspect.signature(check_of).parameters:
            check_of(served, printed[name], second=True)  # type: ignore[call-arg]
        else:
            check_of(served, printed[name])


# --- small helpers for the checks -----------------------------------------------------------
def _values(text: str) -> list[Any]:
    """The JSON values printed one after the other (curl ...; echo)."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values


def _docs_files(*suffixes: str) -> int:
    return sum(1 for p in DOCS.rglob("*") if p.suffix in suffixes)


# --- README.md -------------------------------------------------------------------------------
@check("setup")
def _setup(served: Served, out: str) -> None:
    assert out == ""


@check("tour")
def _tour(served: Served, out: str, second: bool = False) -> None:
    # The run of alice's pending messages: done, or empty when the worker was quicker.
    head, status, tail = re.split(r"\n(done|empty)\n", out)
    assert status in ("done", "empty"), out
    written, hits, chat = _values(head)
    [memories] = _values(tail)
    assert (written["documents"], written["chunks_written"]) == (2, 2)
    assert [hit["text"] for hit in hits["results"]] == [
        "Support answers on weekdays from 9 to 5, Lisbon time."
    ]
    assert chat["choices"][0]["message"]["content"] == ANSWER
    # The first time alice had no memories yet; the second, what the first one learned.
    assert [m["content"] for m in chat["memories"]] == ([FACT] if second else [])
    # What it learned from the chat, shown at once (and not twice the second time).
    assert [m["content"] for m in memories["results"]] == [FACT]


@check("readme-search")
def _readme_search(served: Served, out: str) -> None:
    [hits] = _values(out)
    assert [h["text"] for h in hits["results"]] == [
        "Refunds are paid within ten days of the request."
    ]
    assert hits["results"][0]["vector_score"] is None  # mode keyword


@check("readme-memory-base")
def _readme_memory_base(served: Served, out: str) -> None:
    kb = str(uuid.UUID(out))  # the memory base's own knowledge base
    chunks = served.until(f"/api/v1/knowledge-bases/{kb}/chunks", lambda b: b["count"] == 1)
    assert [c["text"] for c in chunks["results"]] == ["Yes: invoices are due in 30 days."]


@check("readme-history")
def _readme_history(served: Served, out: str) -> None:
    [history] = _values(out)
    assert history["messages"] == [
        {"role": "user", "content": "Can I pay by invoice?"},
        {"role": "assistant", "content": "Yes: invoices are due in 30 days."},
    ]


@check("readme-stores")
def _readme_stores(served: Served, out: str, second: bool = False) -> None:
    turn = "Input: Which plan? Output: The team plan, billed yearly."
    # (the blackboard keeps every write: the second run's and the first's)
    lines = [f"{n}. {turn}" for n in range(1, 3 if second else 2)]
    assert out.splitlines() == [
        "===== Related Memories =====",
        "",
        "--- notes ---",
        *lines,
        "",
        "===== End of Memory =====",
    ]


@check("readme-personal")
def _readme_personal(served: Served, out: str, second: bool = False) -> None:
    [added] = _values(out)
    stored = [m["content"] for m in added[("duplicates" if second else "memories")]]
    assert stored == ["User prefers email over phone calls"]
    assert (added["duplicates" if not second else "memories"], added["evicted"]) == ([], [])


@check("readme-engine")
def _readme_engine(served: Served, out: str, second: bool = False) -> None:
    [found] = _values(out)
    assert found["scope"] == ["user", "bob"]
    contents = [f["content"] for f in found["results"]]
    if second:  # bob also has the fact the first run's tool call stored
        assert sorted(contents) == [
            "User prefers email over phone calls",
            "User works night shifts",
        ]
    else:
        assert contents == ["User prefers email over phone calls"]


@check("readme-tools")
def _readme_tools(served: Served, out: str) -> None:
    [called] = _values(out)
    assert called["name"] == "manage_memory" and called["scope"] == ["user", "bob"]
    assert called["result"]["content"] == "User works night shifts"
    assert called["result"]["action"] in ("created", "unchanged")  # (the second run)


# --- docs/api.md -----------------------------------------------------------------------------
@check("api-key-command")
def _api_key_command(served: Served, out: str) -> None:
    key = out.splitlines()[-1]
    assert key.startswith("mem_")
    assert served.get("/api/v1/me", key)[1]["username"] == "alice"
    keys = served.get("/api/v1/api-keys?page_size=500")[1]["results"]
    assert "laptop" in [k["name"] for k in keys]


@check("api-keys")
def _api_keys(served: Served, out: str) -> None:
    me, key, revoked = out.splitlines()
    assert json.loads(me)["username"] == "alice"
    revoked = json.loads(revoked)
    assert (revoked["name"], revoked["is_active"]) == ("ci", False)
    assert revoked["revoked_at"] is not None and key.startswith(revoked["prefix"])
    status, body = served.get("/api/v1/me", key)
    assert (status, body["error"]["code"]) == (401, "not_authenticated")  # revoked


@check("api-key-read-only")
def _api_key_read_only(served: Served, out: str) -> None:
    shown, refused = out.splitlines()
    assert shown == "True"
    error = json.loads(refused)["error"]
    assert error["code"] == "read_only_key" and "read-only" in error["message"]


@check("api-key-limits")
def _api_key_limits(served: Served, out: str) -> None:
    shown, refused = out.splitlines()
    assert shown == "['user', 'u1']"
    error = json.loads(refused)["error"]
    assert error["code"] == "key_limit" and "['user', 'u1']" in error["message"]


@check("api-error")
def _api_error(served: Served, out: str) -> None:
    [error] = _values(out)
    assert error == {"error": {"code": "invalid", "message": "name: Must be a string.",
                               "details": {"name": ["Must be a string."]}}}  # fmt: skip


@check("api-pagination")
def _api_pagination(served: Served, out: str) -> None:
    [page] = _values(out)
    assert len(page["results"]) == 1 and page["previous"] is None
    assert page["next"].endswith("/api/v1/api-keys?page=2&page_size=1")
    assert page["count"] == served.get("/api/v1/api-keys")[1]["count"] >= 4


# --- docs/conversations.md ----------------------------------------------------------------------
@check("conv-history")
def _conv_history(served: Served, out: str) -> None:
    first, *text = out.splitlines()
    history = json.loads(first)
    assert history["messages"] == [
        {"role": "user", "content": "My printer is offline."},
        {"role": "assistant", "content": "Check its network cable, then restart it."},
        {"role": "user", "content": "Still offline."},
    ]  # the regenerated answer, not the first one
    assert [i["message_id"] for i in history["items"]] == ["q1", "a1b", "q2"]
    assert (history["thread_length"], history["truncated"]) == (3, 0)
    assert text == [
        "Human: My printer is offline.",
        "Assistant: Check its network cable, then restart it.",
        "Human: Still offline.",
    ]


@check("node-memory")
def _node_memory(served: Served, out: str) -> None:
    history, deleted = out.splitlines()
    assert json.loads(history)["messages"] == [
        {"role": "user", "content": "Printer offline"},
        {"role": "assistant", "content": "category: hardware"},
    ]
    assert deleted == "204"


# --- docs/engine.md ------------------------------------------------------------------------------
@check("engine-facts")
def _engine_facts(served: Served, out: str) -> None:
    lines = out.splitlines()
    added, correction, found = (json.loads(line) for line in lines[:3])
    assert (added["decision"]["action"], correction["decision"]["action"]) == ("add", "add")
    assert [f["content"] for f in found["results"]] == ["Acme customers get replies in Portuguese"]
    assert lines[3:] == [
        "- [correction | 0.95] Never promise refunds by phone",
        "- [preference | 0.90] Acme customers get replies in Portuguese",
    ]


@check("engine-flush")
def _engine_flush(served: Served, out: str) -> None:
    flush, facts, journal = _values(out)
    assert (flush["status"], flush["scope"]) == ("pending", ["org", "acme", "support-bot"])
    learned = {f["content"]: f["source"] for f in facts["results"]}
    assert learned["User runs the Porto office"] == {"kind": "message", "ref": "m-1"}
    # Today's day (and yesterday's too when the run crossed midnight), newest first.
    today = datetime.now(UTC).date()
    days = [today.isoformat(), (today - timedelta(days=1)).isoformat()]
    assert journal["days"] in (days[:1], days), journal["days"]


@check("engine-summaries")
def _engine_summaries(served: Served, out: str) -> None:
    [summary] = _values(out)
    assert (summary["llm_calls"], summary["folded_now"]) == (1, ["1", "2"])
    assert summary["messages"][0]["role"] == "system"
    assert summary["messages"][1:] == [
        {"role": "user", "content": "Thanks. Will I get a tracking link?"}
    ]
    assert summary["running_summary"]["last_summarized_message_id"] == "2"


# --- docs/knowledge.md -----------------------------------------------------------------------------
@check("kb-ingest-search")
def _kb_ingest_search(served: Served, out: str) -> None:
    written, hits = _values(out)
    assert (written["documents"], written["chunks_written"]) == (2, 2)
    assert (written["knowledge_base"], written["chunks"]) == (
        str(uuid.UUID(written["knowledge_base"])),
        2,
    )
    assert [h["text"] for h in hits["results"]] == ["Refunds are paid within ten days."]
    assert hits["results"][0]["metadata"]["team"] == "billing"


@check("kb-background")
def _kb_background(served: Served, out: str) -> None:
    job, chunks = _values(out)
    assert (job["kind"], job["status"], job["chunks_written"]) == (
        "knowledge_ingest", "succeeded", 1
    )  # fmt: skip
    assert sorted(c["document_key"] for c in chunks["results"]) == [
        "gift-cards", "refunds", "shipping"
    ]  # fmt: skip


@check("kb-search-all")
def _kb_search_all(served: Served, out: str) -> None:
    [hits] = _values(out)
    assert [h["text"] for h in hits["results"]] == ["Gift cards never expire."]


@check("index-files")
def _index_files(served: Served, out: str) -> None:
    assert "Created file-backed knowledge base 'Docs' for alice." in out
    pages = _docs_files(".md", ".txt")
    assert f"added={pages} updated=0 unchanged=0 deleted=0 skipped=0" in out


# --- docs/memory-bases.md ------------------------------------------------------------------------------
@check("mb-capture")
def _mb_capture(served: Served, out: str) -> None:
    [hits] = _values(out)
    [hit] = hits["results"]
    assert hit["text"] == "It should arrive on Thursday."
    assert (hit["metadata"]["session_id"], hit["metadata"]["run_id"]) == ("order-77", "run-1")


@check("mb-flush")
def _mb_flush(served: Served, out: str) -> None:
    [job] = _values(out)
    assert (job["kind"], job["status"], job["trigger"]) == (
        "memory_base_sync",
        "succeeded",
        "manual",
    )
    assert (job["session_id"], job["messages_processed"]) == ("order-77", 1)


@check("mb-regenerate")
def _mb_regenerate(served: Served, out: str) -> None:
    assert (
        "Dry run: would clear all chunks and re-ingest 3 message(s) in 1 session(s). "
        "Nothing changed." in out
    )
    assert out.splitlines()[-1] == "Regenerated: 3 message(s), 3 chunks."


# --- docs/memory-stores.md ------------------------------------------------------------------------------
@check("stores-flow")
def _stores_flow(served: Served, out: str) -> None:
    assert out == ""


@check("stores-load-config")
def _stores_load_config(served: Served, out: str) -> None:
    lines = out.splitlines()
    assert "6 would change, 0 unchanged" in lines and lines[-1] == "6 changed, 0 unchanged"
    loaded = next(line for line in lines if line.startswith("loaded    project_docs:"))
    assert f"'added': {_docs_files('.md', '.mdx')}," in loaded


@check("stores-write-retrieve")
def _stores_write_retrieve(served: Served, out: str) -> None:
    first, *prompt = out.splitlines()
    written = {r["store"]: r["action"] for r in json.loads(first)["results"]}
    assert written == {"convo_cache": "added", "board": "added"}  # project_docs: read-only
    assert prompt[:4] == [
        "===== Related Memories =====",
        "",
        "--- convo_cache ---",
        "1. Input: How do I deploy the service? Output: Deploy with docker compose: run the "
        "migrations first, then start web and worker.",
    ]
    assert prompt[-1] == "===== End of Memory ====="
    # convo_cache embedded through its own block: the endpoint its ${OPENAI_BASE_URL} names
    models = {
        r["json"].get("model") for r in served.llm.requests if r["path"].endswith("/embeddings")
    }
    assert models == {"text-embedding-3-small"}


# --- docs/operations.md ---------------------------------------------------------------------------------
@check("backup-embedded")
def _backup(served: Served, out: str) -> None:
    assert int(out.splitlines()[-1]) > 20  # TABLE DATA entries in the dump
    assert (served.workdir / "memory.dump").stat().st_size > 10_000


@check("restore-embedded")
def _restore(served: Served, out: str) -> None:
    assert out.splitlines()[-1] == "restored"


@check("healthz")
def _healthz(served: Served, out: str) -> None:
    public, status = out.splitlines()
    public = json.loads(public)
    assert set(public) == {"status", "time", "database", "pgvector", "worker"}
    # serve runs this host's worker: the deployment's and this host's, both ok
    assert public["worker"] == {"status": "ok", "host": {"status": "ok"}} and status == "ok"


@check("usage")
def _usage(served: Served, out: str) -> None:
    body = json.loads(out)
    assert set(body) == {"from", "to", "group_by", "totals", "results", "budget"}
    assert body["budget"]["daily_tokens"] is None  # (no cap by default)
    assert body["group_by"] == ["kind"]
    # The tour's chats and extractions so far were counted, for this owner.
    assert body["totals"]["calls"] == sum(r["calls"] for r in body["results"]) > 0
    assert {r["kind"] for r in body["results"]} <= {
        "extraction", "dream", "summary", "memory_base", "query_rewrite", "proxy", "tool_loop",
        "embedding",
    }  # fmt: skip


# --- docs/personal-memories.md -----------------------------------------------------------------------------
@check("proxy-client")
def _proxy_client(served: Served, out: str) -> None:
    memories = ast.literal_eval(out)  # a printed list of dicts
    assert isinstance(memories, list)
    assert all({"id", "content", "type"} <= set(m) for m in memories)
    learned = served.until(
        "/api/v1/users/sam/memories",
        lambda body: "User lives in Lisbon" in [m["content"] for m in body["results"]],
    )
    assert "User lives in Lisbon" in [m["content"] for m in learned["results"]]


@check("proxy-memory-tools")
def _proxy_memory_tools(served: Served, out: str) -> None:
    [call] = ast.literal_eval(out)
    assert call["name"] == "manage_memory"
    assert (call["result"]["action"], call["result"]["content"]) == ("created", "User prefers tea")
    contents = [m["content"] for m in served.get("/api/v1/users/sam/memories")[1]["results"]]
    assert "User prefers tea" in contents


@check("user-memories")
def _user_memories(served: Served, out: str) -> None:
    stored, inferred, found = _values(out)
    assert [m["content"] for m in stored["memories"]] == ["User is a software engineer using Bun"]
    assert [(d["fact"], d["action"]) for d in inferred["decisions"]] == [
        ("User works from Porto on Fridays", "add")
    ]
    assert inferred["update"]["status"] == "done"
    assert [m["content"] for m in found["results"]] == ["User is a software engineer using Bun"]


# --- docs/tools.md ---------------------------------------------------------------------------------------
@check("tools-rest")
def _tools_rest(served: Served, out: str) -> None:
    names, created, refused = out.splitlines()
    assert (
        names == "['manage_memory', 'search_memory', 'retrieve_node_memory', 'write_node_memory']"
    )
    assert json.loads(created)["result"]["action"] == "created"
    assert json.loads(refused)["error"] == {
        "code": "invalid_arguments",
        "message": "invalid arguments: limit: 500 is greater than the maximum of 100",
        "details": {"limit": ["500 is greater than the maximum of 100"]},
    }


@check("mcp-client")
def _mcp_client(served: Served, out: str) -> None:
    names, contents, *markdown = out.splitlines()
    assert sorted(ast.literal_eval(names)) == [
        "manage_memory", "retrieve_node_memory", "search_memory", "write_node_memory"
    ]  # fmt: skip
    assert ast.literal_eval(contents) == ["User prefers dark mode"]
    assert any(re.search(r"User prefers dark mode", line) for line in markdown)
