"""Traces (issue 29, item 4), with the SDK's in-memory exporter: one trace holds a chat
turn, the task it queued, the extraction a later sweep ran for it and the facts it wrote;
REST and MCP requests continue an incoming ``traceparent``; an unreadable one starts a
new trace; the split search leg and a streamed answer stay in the request's trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from core import tracing
from ingestion.updates import updates_sweep
from knowledge.retrieval.db import at_once, legs_reset
from memories.engine.models import PendingUpdate
from memories.facts.models import Fact
from tests.memories.facts.conftest import fixture_embedder, scripted_llm  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
INCOMING = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def spans():
    """Tracing on for the test, every span exported at once to memory. The connections
    opened from now on are traced (this thread's is closed first: the tests that use the
    database here are transaction tests); none stays traced after the test."""
    connection.close()
    exporter = InMemorySpanExporter()
    tracing.tracing_start(exporter, batch=False)
    try:
        yield exporter
    finally:
        tracing.tracing_stop()
        connection.close()
        legs_reset()


def _hex(span_id: int, width: int = 16) -> str:
    return format(span_id, f"0{width}x")


def _children(finished, parent):
    return [
        s for s in finished if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def _descendants(finished, root):
    out, todo = [], [root]
    while todo:
        found = _children(finished, todo.pop())
        out += found
        todo += found
    return out


@pytest.mark.django_db(transaction=True)
def test_a_chat_turn_its_extraction_and_the_facts_share_one_trace(
    spans,
    alice_client,
    llm_settings,
    openai_server,
    fixture_embedder,  # noqa: F811
):
    llm_settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 30  # extracted later, by the sweep
    message = "I drink green tea every morning and I play the violin"
    openai_server.chat_fn = scripted_llm({message: ["User plays the violin"]}, answer="Lovely!")
    response = alice_client.post(
        "/v1/chat/completions",
        {"model": "fake-model", "messages": [{"role": "user", "content": message}]},
        format="json", HTTP_X_OPENWEBUI_USER_ID="u1",
    )  # fmt: skip
    assert response.status_code == 200
    (update,) = PendingUpdate.objects.all()
    assert Fact.objects.count() == 0  # not yet: due in 30 s
    finished = spans.get_finished_spans()
    (request,) = [s for s in finished if s.kind == SpanKind.SERVER]
    trace_id = request.context.trace_id
    assert request.attributes["http.route"] == "v1/chat/completions"
    # The flush remembers the trace: the task that recorded it ran in it.
    (task,) = [s for s in finished if s.name == "task form-memories"]
    assert task.context.trace_id == trace_id and task.kind == SpanKind.CONSUMER
    assert task.parent.span_id == request.context.span_id  # (from the task's payload)
    version, flush_trace, flush_span, _flags = update.traceparent.split("-")
    assert (version, flush_trace, flush_span) == (
        "00",
        _hex(trace_id, 32),
        _hex(task.context.span_id),
    )
    # The proxy's upstream call: its model and tokens, never the prompt.
    (answer,) = [s for s in finished if s.name == "chat fake-model"]
    assert answer.context.trace_id == trace_id and answer.kind == SpanKind.CLIENT
    assert answer.attributes["gen_ai.usage.input_tokens"] == 10
    assert answer.attributes["gen_ai.usage.output_tokens"] == 5
    assert answer.attributes["memory.work.kind"] == "proxy"
    assert not any(
        k.startswith("gen_ai.input") or k.startswith("gen_ai.output") for k in answer.attributes
    )
    spans.clear()

    # Seconds later the sweep (a schedule: no trace of its own) runs the due flush.
    PendingUpdate.objects.update(due_at=timezone.now())
    assert updates_sweep() == 1
    assert list(Fact.objects.values_list("content", flat=True)) == ["User plays the violin"]
    finished = spans.get_finished_spans()
    (run_task,) = [s for s in finished if s.name.startswith("task engine-updates-")]
    assert run_task.context.trace_id != trace_id and run_task.parent is None
    (extraction,) = [s for s in finished if s.name == "memory.extraction"]
    assert extraction.context.trace_id == trace_id  # the chat turn's trace
    assert _hex(extraction.parent.span_id) == flush_span  # the task that recorded the flush
    assert [link.context.span_id for link in extraction.links] == [run_task.context.span_id]
    assert extraction.attributes["memory.facts.written"] == 1
    assert extraction.attributes["memory.run.status"] == "done"
    below = _descendants(finished, extraction)
    (llm,) = [s for s in below if s.name == "chat fake-model"]
    assert llm.attributes["memory.work.kind"] == "extraction"
    assert any(
        "INSERT INTO memories_fact " in s.attributes["db.query.text"]
        for s in below
        if "db.query.text" in s.attributes
    )  # (the engine's statements)
    assert any(
        s.attributes["db.statement"].startswith('UPDATE "memory_engine_pendingupdate"')
        for s in below
        if "db.statement" in s.attributes
    )  # (Django's)


@pytest.mark.django_db(transaction=True)
def test_a_streamed_answer_is_read_in_the_request_trace(
    spans,
    alice_client,
    llm_settings,
    openai_server,
    fixture_embedder,  # noqa: F811
):
    openai_server.chat_fn = scripted_llm({}, answer="Streamed words.")
    response = alice_client.post(
        "/v1/chat/completions",
        {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi there"}]},
        format="json", HTTP_X_OPENWEBUI_USER_ID="u1",
    )  # fmt: skip
    body = b"".join(response.streaming_content)
    response.close()
    assert body.count(b"data: ") > 3 and body.rstrip().endswith(b"data: [DONE]")
    finished = spans.get_finished_spans()
    (request,) = [s for s in finished if s.kind == SpanKind.SERVER]
    (answer,) = [s for s in finished if s.name == "chat fake-model"]
    # Read after the view returned (and its span ended), still the request's child.
    assert answer.parent.span_id == request.context.span_id
    assert answer.end_time >= request.end_time
    assert answer.attributes["memory.work.kind"] == "proxy"
    assert answer.attributes["memory.usage.estimated"] is True  # no usage in the stream


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/api/v1/knowledge-bases", "/mcp"])
def test_requests_continue_an_incoming_traceparent(spans, alice_client, path):
    if path == "/mcp":
        response = alice_client.post(
            path, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            content_type="application/json", HTTP_TRACEPARENT=INCOMING,
            HTTP_ACCEPT="application/json, text/event-stream",
        )  # fmt: skip
        assert b'"name":"write_node_memory"' in b"".join(response.streaming_content)
    else:
        response = alice_client.get(path, HTTP_TRACEPARENT=INCOMING)
    assert response.status_code == 200
    finished = spans.get_finished_spans()
    (request,) = [s for s in finished if s.kind == SpanKind.SERVER]
    assert _hex(request.context.trace_id, 32) == TRACE_ID
    assert _hex(request.parent.span_id) == PARENT_ID and request.parent.is_remote
    # Its statements (the key's lookup first) are its children.
    statements = [
        s for s in _descendants(finished, request) if s.attributes.get("db.system") == "postgresql"
    ]
    assert statements and "core_apikey" in statements[0].attributes["db.statement"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "header", ["garbage", "00-zzzz-00f067aa0ba902b7-01", f"00-{'0' * 32}-{PARENT_ID}-01", ""]
)
def test_an_unreadable_traceparent_starts_a_new_trace(spans, alice_client, header):
    response = alice_client.get("/api/v1/knowledge-bases", HTTP_TRACEPARENT=header)
    assert response.status_code == 200
    (request,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert request.parent is None and request.context.trace_id != int(TRACE_ID, 16)


def test_the_split_search_leg_runs_in_the_callers_trace(spans):
    def where():
        return trace.get_current_span().get_span_context().span_id, threading.current_thread().name

    with tracing.span("search") as outer:
        here, there = at_once([where, where])
    assert here == (outer.get_span_context().span_id, threading.current_thread().name)
    assert there[0] == outer.get_span_context().span_id and there[1].startswith("search-leg")


@pytest.mark.django_db(transaction=True)
def test_prompt_and_answer_text_only_when_asked(spans, alice_client, llm_settings, openai_server):
    llm_settings.TRACE_MESSAGE_CONTENT = True
    openai_server.chat_fn = scripted_llm({}, answer="Sure thing.")
    response = alice_client.post(
        "/v1/chat/completions",
        {"model": "fake-model", "messages": [{"role": "user", "content": "a secret question"}]},
        format="json",
    )
    assert response.status_code == 200
    (answer,) = [s for s in spans.get_finished_spans() if s.name == "chat fake-model"]
    assert "a secret question" in answer.attributes["gen_ai.input.messages"]
    assert answer.attributes["gen_ai.output.messages"] == "Sure thing."
    # A long prompt is cut at the attribute limit (OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT).
    spans.clear()
    long = "word " * 5_000
    alice_client.post("/v1/chat/completions",
                      {"model": "fake-model", "messages": [{"role": "user", "content": long}]},
                      format="json")  # fmt: skip
    (answer,) = [s for s in spans.get_finished_spans() if s.name == "chat fake-model"]
    assert len(answer.attributes["gen_ai.input.messages"]) == tracing.ATTRIBUTE_CHARS


@pytest.mark.parametrize(
    "environment, on",
    [
        ({}, "False "),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_EXPORTER": ""}, "False "),  # (as copied)
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"},
         "True http://127.0.0.1:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b/t"},
         "True http://b/t"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "True "),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
         "False http://127.0.0.1:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces",
          "OTEL_SDK_DISABLED": "true"}, "False http://127.0.0.1:4318/v1/traces"),
    ],
)  # fmt: skip
def test_off_by_default_and_on_with_the_standard_variables(environment, on):
    """On or off, and where the spans go (an empty variable counts as unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(environment, MEMORY_ENV_FILE="")
    done = subprocess.run(
        [sys.executable, "-c",
         "import memoryproject.settings as s; print(s.TRACING, s.OTEL_TRACES_ENDPOINT)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout.rstrip("\n") == on, done.stderr
