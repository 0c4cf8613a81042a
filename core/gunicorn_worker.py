"""gunicorn's gthread worker, answering its own errors in the API's JSON shape.

gunicorn refuses some requests before Django sees them (a request line over
``limit_request_line``, 4,094 bytes: 414; headers too large: 431; a malformed request
line: 400) and writes an HTML page. With this worker class those answers carry the
project's error body (``{"error": {"code", "message", "details"}}``, plus OpenAI's
``type`` and ``param``, since the path is unknown when the request line is unreadable).
"""

from __future__ import annotations

import json
from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

_CODES = {400: "bad_request", 403: "forbidden", 414: "uri_too_long", 431: "headers_too_large"}


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    kind = "api_error" if status_int >= 500 else "invalid_request_error"
    body = json.dumps(
        {
            "error": {
                "code": _CODES.get(status_int, "server_error" if status_int >= 500 else "invalid"),
                "message": f"{reason}: {mesg}" if mesg else reason,
                "details": None,
                "type": kind,
                "param": None,
            }
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    util.write_nonblock(sock, head + body)


# Worker.handle_error looks write_error up in gunicorn.util when it answers.
util.write_error = write_json_error


class JSONErrorThreadWorker(ThreadWorker):
    """``--worker-class core.gunicorn_worker.JSONErrorThreadWorker``"""
