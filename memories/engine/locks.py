"""The scope's run lock: one background writer of a scope at a time.

A debounced-update run and a dream of one scope both read the scope's facts, call
the LLM and write back; holding this session-level advisory lock across the whole
run (no transaction stays open during the LLM call) keeps them from interleaving.
PostgreSQL drops it with a dead worker's connection, so a crash never leaves a
scope locked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from core.db import advisory_session_lock
from core.errors import Conflict


class ScopeBusy(Conflict):
    code = "scope_busy"


@contextmanager
def scope_run_lock(scope_id: int) -> Iterator[bool]:
    """Whether this process may run background work on the scope now."""
    with advisory_session_lock(f"engine-scope:{scope_id}") as taken:
        yield taken


@contextmanager
def scope_run_lock_waiting(scope_id: int, seconds: float) -> Iterator[bool]:
    """The scope's run lock, waiting up to ``seconds`` for the run holding it to end
    (polled: a blocking ``pg_advisory_lock`` could not be given up on). Yields
    whether it was taken."""
    deadline = time.monotonic() + seconds
    while True:
        with scope_run_lock(scope_id) as taken:
            if taken or time.monotonic() >= deadline:
                yield taken
                return
        time.sleep(0.1)
