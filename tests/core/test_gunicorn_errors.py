"""What gunicorn answers itself (before Django sees the request) is JSON too: the real
gunicorn that `manage.py serve` starts (the shared served instance, tests/served.py),
with the worker class the Dockerfile uses too."""

from __future__ import annotations

import json
import socket

import pytest

pytestmark = pytest.mark.slow


def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (
            b"GET /api/v1/flows?q=" + b"x" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            414,
            "uri_too_long",
        ),
        (
            b"GET /api/v1/flows HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"y" * 9000 + b"\r\n\r\n",
            431,
            "headers_too_large",
        ),
        (b"NOT A REQUEST LINE\r\n\r\n", 400, "bad_request"),
    ],
)
def test_gunicorn_refusals_are_json(shared_served, request_bytes, status, code):
    got, headers, body = _raw(shared_served.port, request_bytes)
    assert got == status
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert set(error) == {"code", "message", "details", "type", "param"}


def test_django_answers_through_the_same_worker(shared_served):
    got, headers, body = _raw(
        shared_served.port,
        b"GET /api/v1/nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert got == 404
    assert json.loads(body)["error"]["code"] == "not_found"


def test_a_chunked_mcp_request_is_read_whole(shared_served):
    """``/mcp`` reads the body itself (to refuse what is no JSON-RPC request) and hands
    it on: a chunked body, which gunicorn de-chunks and no Content-Length bounds, is read
    to its end and answered."""
    import http.client

    key = shared_served.key_for("mcp-chunked")
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", shared_served.port, timeout=30)
    connection.request("POST", "/mcp", body=iter([body[:10], body[10:]]), encode_chunked=True,
                       headers={"Authorization": f"Bearer {key}",
                                "Content-Type": "application/json",
                                "Accept": "application/json, text/event-stream"})  # fmt: skip
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == 200, answer
    assert answer["id"] == 7
    assert {"manage_memory", "search_memory"} <= {t["name"] for t in answer["result"]["tools"]}


def test_a_chunked_mcp_request_over_the_size_limit_is_a_413(shared_served):
    """A chunked body has no Content-Length for the size middleware to refuse: ``/mcp``
    reads it up to ``MAX_REQUEST_BYTES`` and answers 413 past it, in the error shape,
    without reading the rest into memory."""
    import http.client

    from django.conf import settings

    key = shared_served.key_for("mcp-chunked-large")
    piece = b" " * (1024 * 1024)
    pieces = [piece] * (settings.MAX_REQUEST_BYTES // len(piece)) + [b" " * 4096]
    connection = http.client.HTTPConnection("127.0.0.1", shared_served.port, timeout=60)
    try:
        connection.request("POST", "/mcp", body=iter([b'{"jsonrpc": "2.0"', *pieces]),
                           encode_chunked=True,
                           headers={"Authorization": f"Bearer {key}",
                                    "Content-Type": "application/json",
                                    "Accept": "application/json, text/event-stream"})  # fmt: skip
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == 413, answer
    assert (answer["error"]["code"], answer["error"]["message"]) == (
        "payload_too_large",
        f"Request body exceeds the limit of {settings.MAX_REQUEST_BYTES} bytes.",
    )  # fmt: skip


def test_a_chunked_api_request_is_read_whole(shared_served):
    """Any API body may come chunked (no Content-Length): Django reads none without its
    length, and the request ran as if empty (400 "name: This field is required.", an
    import of "the file is empty")."""
    import http.client

    key = shared_served.key_for("api-chunked")
    body = json.dumps({"name": "chunked-kb"}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", shared_served.port, timeout=30)
    connection.request("POST", "/api/v1/knowledge-bases", body=iter([body[:7], body[7:]]),
                       encode_chunked=True, headers={"Authorization": f"Bearer {key}",
                                                     "Content-Type": "application/json"})  # fmt: skip
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == 201, answer
    assert answer["name"] == "chunked-kb"
