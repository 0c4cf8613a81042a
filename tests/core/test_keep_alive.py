"""Polling through the real gunicorn that `manage.py serve` starts (the shared served
instance, tests/served.py), over one kept-alive connection, at the intervals that broke:
with gunicorn's default 2 s keep-alive the server closed the idle connection just as the
next poll was sent on it, and the client got "Server disconnected without sending a
response" (no server log line: the request never reached a worker's handler)."""

from __future__ import annotations

import http.client
import json
import time
import uuid

import pytest

pytestmark = pytest.mark.slow
INTERVALS = [2.0, 2.0, 2.5, 5.0]  # a 2 s poll, and httpx's 5 s idle keep-alive


def test_polling_a_job_over_one_kept_alive_connection(shared_served):
    connection = http.client.HTTPConnection("127.0.0.1", shared_served.port, timeout=15)
    path = f"/api/v1/jobs/{uuid.uuid4()}"
    answers = []
    sockets = set()
    for pause in [0.0, *INTERVALS]:
        time.sleep(pause)
        # http.client never reconnects by itself: a connection the server closed
        # meanwhile raises RemoteDisconnected (or a reset) here.
        connection.request("GET", path, headers={"Connection": "keep-alive"})
        response = connection.getresponse()
        answers.append((response.status, json.loads(response.read())["error"]["code"]))
        sockets.add(id(connection.sock))
    connection.close()
    assert answers == [(401, "not_authenticated")] * (len(INTERVALS) + 1)
    assert len(sockets) == 1  # one connection served every poll
