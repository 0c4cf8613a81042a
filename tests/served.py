"""One served instance for the tests that only talk to the service over HTTP.

``shared_served`` is ``manage.py serve`` (gunicorn with the worker class of production, and the
supervised worker cluster) on a free loopback port, with its own data directory and so
its own embedded PostgreSQL (``scripts.faults.harness.Instance``). It runs as the fault
suite's does, with the defaults of a fresh machine: no chat LLM (the attackers'
sections expect the 503 that says so), the hashing embedder.

The modules in ``SERVED_MODULES`` share it: the test run keeps them together, on one
test process (tests/conftest.py), which starts the instance for the first of their tests
and stops it after the last (its idle worker polls its database, which the other tests
would pay for). A test of another module asking for it is refused at collection time.

How a new process test reuses it (rather than starting a server of its own):

- add the module to ``SERVED_MODULES``, mark it ``slow`` and take the
  fixture ``shared_served``;
- talk to it over HTTP: ``shared_served.get(path)``, ``shared_served.post(path, body)``,
  ``shared_served.raw(...)`` (bytes as given), ``.base_url``, ``.port``; make the
  test's own users and keys with ``shared_served.key_for("<a username of its own>")``, so
  tests never see each other's objects (``.ensure_key()`` is the fault suite's
  user, whose objects the attackers' sections create);
- read its database with ``shared_served.query(sql)``; run commands in its environment with
  ``.manage(...)`` or ``.env``;
- leave background work finished when the test ends: the attackers' sections compare
  every row of every project table and would see it land;
- leave it running and its settings alone. A test that kills or stops processes, or
  needs other settings (a chat LLM, another stall limit, no worker), starts an
  ``Instance`` of its own in a module-scoped fixture, as test_self_healing.py and
  test_engine_updates_qcluster.py do (or ``serve_env`` in test_serve.py: the test run's
  server, a database of its own).
"""

from __future__ import annotations

import threading

import pytest
from django.conf import settings

from scripts.faults.harness import Instance

SERVED_MODULES = (
    "tests/core/test_attacks.py",
    "tests/core/test_gunicorn_errors.py",
    "tests/core/test_keep_alive.py",
)
_running: list[Instance] = []  # the instance, while one runs in this test process
_stopping: list[threading.Thread] = []


@pytest.fixture
def shared_served() -> Instance:
    """The shared instance, healthy (web and worker) when the test starts."""
    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs an instance on an embedded server of its own")
    if not _running:
        instance = Instance()
        _running.append(instance)  # stopped by served_stop() even if it never gets healthy
        instance.start()
    _running[0].wait_healthy()
    return _running[0]


def served_stop(*, wait: bool = False) -> None:
    """Stop the shared instance and remove its data directory, if one runs: in the
    background (the next tests need not wait for it), or waiting for every stop so far."""
    while _running:
        thread = threading.Thread(target=_running.pop().destroy, name="served-stop")
        thread.start()
        _stopping.append(thread)
    while wait and _stopping:
        _stopping.pop().join()
