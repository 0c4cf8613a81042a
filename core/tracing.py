"""Traces (OpenTelemetry): off by default, on with the standard ``OTEL_*`` variables.

When on (``settings.TRACING``, read from the environment at start), every process (web,
worker, command) starts the SDK once, with an OTLP/HTTP exporter behind the batch span
processor, and uses the maintained instrumentations: Django (a span per request, REST,
``/v1/chat/completions`` and ``/mcp`` alike, continuing an incoming ``traceparent``)
and psycopg (a span per statement). Where none exists the SDK's API is used here:

- a span per LLM call and per embedding call (``llm_span``, ``embedding_span``), with the
  model and the token counts the usage accounting records (``note_usage``); prompt and
  answer text only with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``;
- a span per background task: the ``traceparent`` of whatever queued it travels in the
  django-q2 task's payload (``pre_enqueue``) and is the parent of the task's span in the
  worker (``pre_execute`` .. ``post_execute_in_worker``);
- a debounced update keeps its flush's ``traceparent`` in its row, so the extraction that
  runs it seconds later joins the chat turn's trace (``span(parent=...)``);
- ``carry`` and ``carry_iter`` take the current context into the split search leg's
  thread and into a streamed answer, which Django iterates after the view returned.

Off, every helper here costs a function call and an ``if``: no SDK object is made.
"""

from __future__ import annotations

import json
import logging
import multiprocessing.util
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

from django.conf import settings
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

log = logging.getLogger(__name__)
T = TypeVar("T")
SERVICE_NAME = "memory-service"
# A text attribute (a statement's SQL, a prompt when asked for) at most this long, unless
# OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT says otherwise.
ATTRIBUTE_CHARS = 4_096
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"  # the SDK's, with OTEL_TRACES_EXPORTER=otlp

_provider: Any = None  # the SDK's TracerProvider, once started
_tracer: trace.Tracer | None = None
_running: dict[str, tuple[Span, object]] = {}  # task id -> (span, context token)


def active() -> bool:
    return _tracer is not None


def tracing_start_from_settings() -> None:
    """Start tracing in this process when the settings say so (``apps.ready``)."""
    if settings.TRACING and not active():
        tracing_start(_exporter_from_environment())


def tracing_start(exporter: Any, *, batch: bool = True, connections: bool = True) -> Any:
    """Start the SDK with ``exporter`` (behind the batch processor, or the simple one),
    instrument Django and psycopg, and carry context through django-q2's tasks. Returns
    the tracer provider. Django's middleware is added to ``settings.MIDDLEWARE``: a
    handler built before this (a test client already used) has none. psycopg traces the
    connections opened from now on (``connections=False``: none; a test instruments its
    own open connection instead, and leaves no traced one behind)."""
    global _provider, _tracer
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=_resource(), span_limits=_limits())
    provider.add_span_processor(
        BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    )
    DjangoInstrumentor().instrument(tracer_provider=provider)
    if connections:
        PsycopgInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    _provider, _tracer = provider, provider.get_tracer("memory-service")
    _connect_task_signals()
    return provider


def tracing_stop() -> None:
    """Undo ``tracing_start`` (the tests' way out): spans still buffered are exported."""
    global _provider, _tracer
    if _provider is None:
        return
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    DjangoInstrumentor().uninstrument()
    if PsycopgInstrumentor().is_instrumented_by_opentelemetry:
        PsycopgInstrumentor().uninstrument()
    _disconnect_task_signals()
    provider, _provider, _tracer = _provider, None, None
    provider.shutdown()


def _exporter_from_environment() -> Any:
    if settings.OTEL_TRACES_EXPORTER == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    # The endpoint as the settings read it (an empty variable is unset there, where the
    # SDK would take it as the endpoint); headers, timeout and compression: OTEL_*.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.OTEL_TRACES_ENDPOINT or DEFAULT_ENDPOINT)


def _limits() -> Any:
    """The SDK's span limits (its ``OTEL_*_LIMIT`` variables), with a text attribute at
    most ``ATTRIBUTE_CHARS`` long by default (unlimited, a search's SQL would be
    exported whole, several kilobytes, with each search; its leading comment names it)."""
    from opentelemetry.sdk.trace import SpanLimits

    limits = SpanLimits()
    if limits.max_attribute_length is None:
        limits = SpanLimits(max_attribute_length=ATTRIBUTE_CHARS)
    return limits


def _resource() -> Any:
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    return resource


# --- spans -----------------------------------------------------------------------------
def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict[str, Any] | None = None,
    parent: str = "",
    links: Sequence[str] = (),
) -> AbstractContextManager[Span | None]:
    """A span around the block, current inside it (None when tracing is off).
    ``parent``: a ``traceparent`` to continue instead of the current context (an
    unreadable one starts a new trace); ``links``: other ``traceparent``s it relates to."""
    if _tracer is None:
        return nullcontext()
    context = _extract(parent) if parent else None
    linked = [Link(c) for c in (_span_context(t) for t in links) if c is not None]
    return _tracer.start_as_current_span(
        name, context=context, kind=kind, attributes=attributes, links=linked
    )


def llm_span(
    model: str, messages: Any = None, operation: str = "chat"
) -> AbstractContextManager[Span | None]:
    """A span around one LLM call (current inside: the usage counted there lands on it)."""
    if _tracer is None:
        return nullcontext()
    return _tracer.start_as_current_span(
        f"{operation} {model}",
        kind=SpanKind.CLIENT,
        attributes=_llm_attributes(model, messages, operation),
    )


def llm_span_open(model: str, messages: Any = None) -> Span | None:
    """A span for a streamed LLM call, ended by the caller (``llm_span_close``) when the
    stream ends: a generator's frames run in whatever context reads it."""
    if _tracer is None:
        return None
    return _tracer.start_span(
        f"chat {model}", kind=SpanKind.CLIENT, attributes=_llm_attributes(model, messages, "chat")
    )


@contextmanager
def within(span_: Span | None) -> Iterator[None]:
    """``span_`` current inside the block (not ended by it)."""
    if span_ is None:
        yield
        return
    with trace.use_span(span_, end_on_exit=False):
        yield


def _llm_attributes(model: str, messages: Any, operation: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
    }
    if settings.TRACE_MESSAGE_CONTENT and messages is not None:
        attributes["gen_ai.input.messages"] = _text(messages)
    return attributes


def statements_span(statements: Sequence[str]) -> AbstractContextManager[Span | None]:
    """A span for statements sent on a raw psycopg cursor in one round trip (the search
    engine's pipeline, which the psycopg instrumentation does not see): their SQL, never
    their parameters."""
    if _tracer is None:
        return nullcontext()
    first = statements[0].split(None, 1) if statements else []
    attributes: dict[str, Any] = {"db.system.name": "postgresql",
                                  "db.query.text": ";\n".join(statements)[:ATTRIBUTE_CHARS]}  # fmt: skip
    if len(statements) > 1:
        attributes["db.operation.batch.size"] = len(statements)
    return _tracer.start_as_current_span(
        first[0].upper() if first else "postgresql", kind=SpanKind.CLIENT, attributes=attributes
    )


def embedding_span(model: str, texts: int) -> AbstractContextManager[Span | None]:
    if _tracer is None:
        return nullcontext()
    return _tracer.start_as_current_span(
        f"embeddings {model}", kind=SpanKind.CLIENT,
        attributes={"gen_ai.operation.name": "embeddings", "gen_ai.request.model": model,
                    "memory.embedding.texts": texts},
    )  # fmt: skip


def note_usage(*, kind: str, model: str, tokens_in: int, tokens_out: int, estimated: bool) -> None:
    """What the usage accounting counted for a call, on the call's span (the current one)."""
    if _tracer is None:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes({
            "gen_ai.response.model": model, "gen_ai.usage.input_tokens": tokens_in,
            "gen_ai.usage.output_tokens": tokens_out, "memory.usage.estimated": estimated,
            "memory.work.kind": kind,
        })  # fmt: skip


def note_answer(text: str) -> None:
    """An LLM answer's text on its span (the current one), when content is asked for."""
    if _tracer is not None and settings.TRACE_MESSAGE_CONTENT and text:
        trace.get_current_span().set_attribute("gen_ai.output.messages", _text(text))


def annotate(span_: Span | None, attributes: dict[str, Any]) -> None:
    if span_ is not None and span_.is_recording():
        span_.set_attributes(attributes)


def span_end(span_: Span | None, exc: BaseException | None = None) -> None:
    """End a span opened by ``llm_span_open`` (None: tracing is off), failed by ``exc``."""
    if span_ is None:
        return
    if exc is not None and span_.is_recording():
        span_.record_exception(exc)
        span_.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    span_.end()


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:ATTRIBUTE_CHARS]


# --- context across threads, streams, rows and tasks ----------------------------------
def traceparent() -> str:
    """The current span's W3C ``traceparent`` ("" when tracing is off or none is current)."""
    if _tracer is None:
        return ""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def _extract(value: str) -> otel_context.Context:
    return propagate.extract({"traceparent": value})


def _span_context(value: str) -> trace.SpanContext | None:
    context = trace.get_current_span(_extract(value)).get_span_context()
    return context if context.is_valid else None


def carry(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run in the current context wherever it runs (another thread)."""
    if _tracer is None:
        return fn
    context = otel_context.get_current()

    def run(*args: Any, **kwargs: Any) -> T:
        token = otel_context.attach(context)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return run


def carry_iter(items: Any) -> Any:
    """``items`` read in the current context, however later (a streamed response)."""
    return items if _tracer is None else _Carried(items, otel_context.get_current())


class _Carried:
    def __init__(self, items: Any, context: otel_context.Context):
        self._items = iter(items)
        self._context = context

    def __iter__(self) -> _Carried:
        return self

    def __next__(self) -> Any:
        token = otel_context.attach(self._context)
        try:
            return next(self._items)
        finally:
            otel_context.detach(token)

    def close(self) -> None:
        close = getattr(self._items, "close", None)
        if close is not None:
            token = otel_context.attach(self._context)
            try:
                close()
            finally:
                otel_context.detach(token)


def attach_context(context: Any) -> object | None:
    """Make ``context`` (from ``current_context``) current; returns the token to detach."""
    return otel_context.attach(context) if context is not None else None


def detach_context(token: object | None) -> None:
    if token is not None:
        otel_context.detach(token)  # type: ignore[arg-type]


def current_context() -> Any:
    return otel_context.get_current() if _tracer is not None else None


# --- django-q2 tasks ---------------------------------------------------------------------
def _on_enqueue(sender: Any, task: dict[str, Any], **kwargs: Any) -> None:
    value = traceparent()
    if value:
        task["traceparent"] = value


def _on_execute(sender: Any, func: Any, task: dict[str, Any], **kwargs: Any) -> None:
    if _tracer is None:
        return
    # The queuer's context, from the payload (a task queued by a schedule has none: a
    # new trace), never the worker's own: in the tests' synchronous mode that would be
    # the request's whatever the payload said.
    parent = _extract(task["traceparent"]) if task.get("traceparent") else otel_context.Context()
    span_ = _tracer.start_span(
        f"task {task.get('name') or func}", context=parent, kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "django-q2", "messaging.message.id": str(task.get("id", "")),
                    "memory.task.func": str(task.get("func", ""))},
    )  # fmt: skip
    token = otel_context.attach(trace.set_span_in_context(span_))
    _running[str(task.get("id", ""))] = (span_, token)


def _on_executed(sender: Any, func: Any, task: dict[str, Any], **kwargs: Any) -> None:
    entry = _running.pop(str(task.get("id", "")), None)
    if entry is None:
        return
    span_, token = entry
    if not task.get("success"):
        span_.set_status(Status(StatusCode.ERROR, str(task.get("result") or "failed")[:200]))
    span_.end()
    otel_context.detach(token)  # type: ignore[arg-type]


def _on_spawn(sender: Any, **kwargs: Any) -> None:
    # A worker process ends with os._exit (no atexit): flush what its batch holds when
    # it stops (recycled, or the cluster stopping).
    if _provider is not None:
        multiprocessing.util.Finalize(None, _provider.force_flush, exitpriority=10)


def _connect_task_signals() -> None:
    from django_q.signals import post_execute_in_worker, post_spawn, pre_enqueue, pre_execute

    pre_enqueue.connect(_on_enqueue, dispatch_uid="core.tracing.enqueue")
    pre_execute.connect(_on_execute, dispatch_uid="core.tracing.execute")
    post_execute_in_worker.connect(_on_executed, dispatch_uid="core.tracing.executed")
    post_spawn.connect(_on_spawn, dispatch_uid="core.tracing.spawn")


def _disconnect_task_signals() -> None:
    from django_q.signals import post_execute_in_worker, post_spawn, pre_enqueue, pre_execute

    pre_enqueue.disconnect(dispatch_uid="core.tracing.enqueue")
    pre_execute.disconnect(dispatch_uid="core.tracing.execute")
    post_execute_in_worker.disconnect(dispatch_uid="core.tracing.executed")
    post_spawn.disconnect(dispatch_uid="core.tracing.spawn")
