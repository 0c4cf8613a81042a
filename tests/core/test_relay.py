"""The chat proxy's relay: bytes out as given, bytes back as they came; SSE split into
events whatever the reads; the provider retry policy (timeouts, 429, 5xx) kept."""

from __future__ import annotations

import json

import pytest

from core.providers.errors import (
    ProviderBadResponse,
    ProviderError,
    ProviderRateLimited,
    ProviderTimeout,
)
from core.providers.relay import ChatRelay, sse_events
from tests.fakes.openai_server import Scripted, chat_body, chat_chunks

STREAM = (
    b": comment\r\n\r\n"
    b'data: {"a":"\xc3\xa9"}\n\n'
    b"event: note\rdata: first line\rdata:second\r\r"
    b"data: [DONE]\n\n"
)


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, len(STREAM)])
def test_events_whatever_the_reads(size):
    events = list(sse_events(_split(STREAM, size)))
    assert [e.raw for e in events] == [
        b": comment\r\n\r\n",
        b'data: {"a":"\xc3\xa9"}\n\n',
        b"event: note\rdata: first line\rdata:second\r\r",
        b"data: [DONE]\n\n",
    ]
    assert [e.data for e in events] == [None, '{"a":"é"}', "first line\nsecond", "[DONE]"]
    assert [e.json() for e in events] == [None, {"a": "é"}, None, None]
    assert [e.done for e in events] == [False, False, False, True]
    assert b"".join(e.raw for e in events) == STREAM


def test_an_event_the_stream_does_not_close_is_closed_with_its_line_ending():
    assert [e.raw for e in sse_events([b"data: 1\r\n\r\ndata: 2\r\n"])] == [
        b"data: 1\r\n\r\n",
        b"data: 2\r\n\r\n",
    ]
    assert [e.raw for e in sse_events([b"data: [DONE]"])] == [b"data: [DONE]\n\n"]
    assert list(sse_events([b""])) == []


def _relay(server, *, max_retries=2):
    return ChatRelay(base_url=server.base_url, api_key="sk-test", timeout=1.0,
                     max_retries=max_retries, backoff=0.01)  # fmt: skip


def test_json_answer_and_request_as_bytes(openai_server):
    answer = {**chat_body("Olá 🌤"), "vendor": {"x": 1.50}}
    scripted = Scripted(body=answer, compact=True)
    openai_server.push(scripted)
    asked = b'{"model":"m",  "messages":[{"role":"user","content":"\\u00e9"}]}'
    got = _relay(openai_server).complete(asked)
    assert got.encode() == scripted.encode(answer)
    (request,) = openai_server.requests
    assert request["raw"] == asked and request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer sk-test"


def test_streamed_events_as_they_came(openai_server):
    chunks = chat_chunks(["a", "é"])
    scripted = Scripted(stream_chunks=chunks, compact=True, split=4)
    openai_server.push(scripted)
    events = list(_relay(openai_server).stream(b'{"stream":true}'))
    assert [e.raw for e in events] == [scripted.event(c) for c in chunks] + [b"data: [DONE]\n\n"]
    assert openai_server.requests[0]["headers"]["accept"] == "text/event-stream"


def test_retries_429_and_5xx_then_succeeds(openai_server):
    openai_server.push(
        Scripted(status=429, body={"error": {"message": "slow"}}, headers={"Retry-After": "0"}),
        Scripted(status=503, body={"error": {"message": "busy"}}),
        Scripted(body=chat_body("ok")),
    )
    assert _relay(openai_server).complete(b"{}").data["choices"][0]["message"]["content"] == "ok"
    assert len(openai_server.requests) == 3


@pytest.mark.parametrize(
    ("scripted", "error", "status", "message", "tries"),
    [
        (Scripted(status=429, body={"error": {"message": "slow"}}), ProviderRateLimited, 429,
         "provider rate limit: slow", 3),
        (Scripted(status=500, body="oops"), ProviderError, 502, "provider answered 500: oops", 3),
        (Scripted(status=404, body={"error": {"message": "no model"}}), ProviderError, 404,
         "provider answered 404: no model", 1),
        (Scripted(body="not json"), ProviderBadResponse, 502, None, 1),
        (Scripted(body="[1]"), ProviderBadResponse, 502,
         "the chat completion is not a JSON object", 1),
        (Scripted(body=chat_body("late"), delay=1.5), ProviderTimeout, 504, None, 3),
    ],
)  # fmt: skip
def test_failures(openai_server, scripted, error, status, message, tries):
    openai_server.push(*[scripted] * 3)
    with pytest.raises(error) as raised:
        _relay(openai_server).complete(b"{}")
    assert raised.value.status_code == status
    if message:
        assert str(raised.value) == message
    assert len(openai_server.requests) == tries


def test_a_stream_that_fails_before_its_first_byte_raises_at_once(openai_server):
    openai_server.push(Scripted(status=400, body={"error": {"message": "bad tools"}}))
    with pytest.raises(ProviderError) as raised:
        _relay(openai_server, max_retries=0).stream(json.dumps({"stream": True}).encode())
    assert (raised.value.status_code, str(raised.value)) == (
        400, "provider answered 400: bad tools",
    )  # fmt: skip


@pytest.mark.parametrize(
    "scripted",
    [Scripted(body=chat_body("not streamed")), Scripted(body='{"id": "x", "choices": ['),
     Scripted(body="<html>busy</html>", headers={"Content-Type": "text/html"})],
)  # fmt: skip
def test_a_stream_answered_with_no_event_stream_is_a_502_at_once(openai_server, scripted):
    """Relayed as events, a JSON answer to a streamed request read as an empty answer
    (200), and the turn was learned from."""
    openai_server.push(scripted)
    with pytest.raises(ProviderError) as raised:
        _relay(openai_server).stream(json.dumps({"stream": True}).encode())
    assert raised.value.status_code == 502
    assert str(raised.value).startswith("provider answered a streamed request with ")
    assert "not text/event-stream" in str(raised.value)
    assert len(openai_server.requests) == 1
