"""The chat proxy's line to the upstream: the request's bytes go out as given and the
answer's bytes come back as they came, a JSON body or server-sent events, nothing
decoded and encoded again on the way (the typed ``openai`` client rebuilds both).

Same policy as the other provider calls (``core.providers.retry``): timeouts, 429 and
5xx are retried with backoff (a stream only before its first byte), every failure
leaves as a ``ProviderError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2

from core.json_text import JsonText
from core.providers.errors import (
    ProviderBadResponse,
    ProviderError,
    ProviderRateLimited,
    ProviderTimeout,
)
from core.providers.retry import MAX_RETRY_AFTER_SECONDS, call_with_retries

PATH = "chat/completions"
_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)")
_BLANK = (b"\r\n", b"\n", b"\r")


@dataclass(frozen=True)
class SSEEvent:
    """One server-sent event: ``raw`` its bytes as they came, its closing blank line
    included; ``data`` its data lines joined (None for an event without data, such as a
    comment)."""

    raw: bytes
    data: str | None

    @property
    def done(self) -> bool:
        return self.data == "[DONE]"

    def json(self) -> Any:
        """The data as JSON; None when it is not JSON."""
        if self.data is None or self.done:
            return None
        try:
            return json.loads(self.data)
        except ValueError:
            return None


def sse_events(chunks: Iterable[bytes]) -> Iterator[SSEEvent]:
    """Split a byte stream into events as the SSE specification does (lines end with
    CRLF, LF or CR; an empty line ends an event), whatever the reads' boundaries. An
    event the stream ends without closing is closed with the line ending it used."""
    buffer, lines = b"", []
    for chunk in chunks:
        buffer += chunk
        at = 0
        while (line := _LINE.match(buffer, at)) is not None:
            if line[0].endswith(b"\r") and line.end() == len(buffer):
                break  # a CR at the end of a read may be the first half of a CRLF
            lines.append(line[0])
            at = line.end()
            if line[0] in _BLANK:
                yield _event(lines)
                lines = []
        buffer = buffer[at:]
    if buffer:
        lines.append(buffer + b"\n")
    if lines:
        ending = b"\r\n" if lines[-1].endswith(b"\r\n") else lines[-1][-1:]
        yield _event([*lines, ending])


def _event(lines: list[bytes]) -> SSEEvent:
    data = []
    for line in lines:
        field, _, value = line.rstrip(b"\r\n").partition(b":")
        if field == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    text = b"\n".join(data).decode("utf-8", errors="replace") if data else None
    return SSEEvent(raw=b"".join(lines), data=text)


class ChatRelay:
    def __init__(
        self, *, base_url: str, api_key: str, timeout: float, max_retries: int, backoff: float
    ) -> None:
        self.max_retries, self.backoff = max_retries, backoff
        self.client = httpx2.Client(
            base_url=base_url.rstrip("/") + "/",
            timeout=timeout,
            headers={"Authorization": f"Bearer {api_key or 'not-needed'}",
                     "Content-Type": "application/json"},
        )  # fmt: skip

    def complete(self, content: bytes) -> JsonText:
        """POST ``content`` to ``/chat/completions``; the answer's body as it came."""

        def call() -> JsonText:
            try:
                response = self.client.post(PATH, content=content)
            except httpx2.HTTPError as exc:
                raise _transport_error(exc) from exc
            _check(response)
            try:
                answer = JsonText.parse(response.content)
            except ValueError as exc:
                raise ProviderBadResponse(f"the chat completion is not JSON: {exc}") from exc
            if not isinstance(answer.data, dict):
                raise ProviderBadResponse("the chat completion is not a JSON object")
            return answer

        return call_with_retries(call, max_retries=self.max_retries, backoff=self.backoff)

    def stream(self, content: bytes) -> Iterator[SSEEvent]:
        """The same request streamed (``content`` asks for it): its events as they come.
        Errors before the answer starts raise here; later ones while iterating."""

        def call() -> httpx2.Response:
            request = self.client.build_request(
                "POST", PATH, content=content, headers={"Accept": "text/event-stream"}
            )
            try:
                response = self.client.send(request, stream=True)
            except httpx2.HTTPError as exc:
                raise _transport_error(exc) from exc
            kind = response.headers.get("content-type", "")
            # (a JSON answer or a page is no stream; an odd type on events is let through)
            streamed = kind.split(",")[0].split(";")[0].strip().lower() not in NOT_STREAMS
            if response.status_code >= 400 or not streamed:
                try:
                    response.read()
                finally:
                    response.close()
            _check(response)
            if not streamed:  # (JSON, a page: relayed as events, it read as an empty answer)
                text = response.content[:300].decode("utf-8", errors="replace")
                raise ProviderError(
                    f"provider answered a streamed request with {kind}, not "
                    f"text/event-stream: {text}"
                )
            return response

        response = call_with_retries(call, max_retries=self.max_retries, backoff=self.backoff)
        return _read(response)


NOT_STREAMS = frozenset({"application/json", "application/problem+json", "text/html"})


def _read(response: httpx2.Response) -> Iterator[SSEEvent]:
    try:
        yield from sse_events(response.iter_bytes())
    except httpx2.HTTPError as exc:
        raise _transport_error(exc) from exc
    finally:
        response.close()


def _transport_error(exc: httpx2.HTTPError) -> ProviderError:
    if isinstance(exc, httpx2.TimeoutException):
        error: ProviderError = ProviderTimeout(f"provider timed out: {exc}")
        error.retryable = True
        return error
    return ProviderError(f"provider unreachable: {exc}")


def _check(response: httpx2.Response) -> None:
    """A status error as the openai client reports it: 429 and 5xx worth a retry."""
    status = response.status_code
    if status < 400:
        return
    message = _error_message(response)
    if status == 429:
        error: ProviderError = ProviderRateLimited(f"provider rate limit: {message}")
    else:
        error = ProviderError(f"provider answered {status}: {message}")
        error.status_code = 502 if status >= 500 else status
    error.retryable = status == 429 or status >= 500
    error.retry_after = _retry_after(response)
    raise error


def _error_message(response: httpx2.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return json.dumps(body)[:500]


def _retry_after(response: httpx2.Response) -> float | None:
    raw = response.headers.get("retry-after")
    try:
        return min(float(raw), MAX_RETRY_AFTER_SECONDS) if raw is not None else None
    except ValueError:
        return None
