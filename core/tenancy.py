"""Whose rows the database lets a statement touch: row-level security's side in Python.

Every table holding an owner's data has an ``owner_id`` column and a policy
(``core.row_security``) that shows a statement only the rows of the owner named by the
setting ``memory.owner_id`` of its transaction, or every row while ``memory.bypass`` is
``on``. The service connects with a role that does not own the tables, so the policies
hold for every statement it sends, a forgotten filter's included.

This module holds what the current request or task runs as, in a context variable:

- ``as_owner(owner_id)``: an owner's request, task, MCP session or chat turn;
- ``bypass(reason)``: the admin and cross-owner maintenance (sweeps, the indexer,
  management commands), explicit and named after what bypasses (logged at DEBUG; the
  code's places that may bypass are listed in ``tests/core/test_row_security.py``);
- neither (the default): a statement on an owner's table fails (``memory.owner_id`` is
  empty, which is no owner id): a path that forgot to say whose work it does is an
  error, never an empty or a cross-tenant answer.

The database backend (``core.db_backend``) sends the settings with the first statement
of every transaction, ``set_config(..., true)`` (``SET LOCAL``): they end with the
transaction, so they hold behind a transaction-pooling proxy too; a statement outside a
transaction carries them in its own implicit one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar, Token
from typing import Any, TypeVar, cast

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
# django-q2's group of a task done for an owner (core.queue.owner_group).
OWNER_GROUP = "owner:"

# (owner id as text, bypass reason): ("", "") is neither.
State = tuple[str, str]
NOBODY: State = ("", "")
_state: ContextVar[State] = ContextVar("memory_row_owner")
# What a context that set nothing runs as (a thread's own context sets nothing): nobody;
# the test suite's own threads run as its test code does (``set_fallback``).
_fallback: list[State] = [NOBODY]

# The two settings of a transaction, in the order of ``settings_params``.
OWNER_SETTINGS = ("memory.owner_id", "memory.bypass")


def state() -> State:
    return _state.get(_fallback[0])


def set_fallback(value: State) -> None:
    _fallback[0] = value


def current_owner_id() -> int | None:
    owner = state()[0]
    return int(owner) if owner else None


def settings_params(value: State) -> list[str]:
    """The values of ``OWNER_SETTINGS`` for ``value``."""
    return [value[0], "on" if value[1] else ""]


def enter_owner(owner_id: int) -> Token[State]:
    """Run as ``owner_id`` from now on (until ``leave(token)``): for the API's
    authentication, which learns the owner in the middle of a request (the middleware
    that started the request resets what it set at its end)."""
    return _state.set((str(int(owner_id)), ""))


def enter(value: State) -> Token[State]:
    return _state.set(value)


def leave(token: Token[State]) -> None:
    _state.reset(token)


@contextmanager
def running_as(value: State) -> Iterator[None]:
    """``value`` for the block, whatever ran before it and after it."""
    token = _state.set(value)
    try:
        yield
    finally:
        _state.reset(token)


def as_owner(owner_id: int) -> AbstractContextManager[None]:
    return running_as((str(int(owner_id)), ""))


def enter_bypass(reason: str) -> Token[State]:
    return _state.set(_bypass_state(reason))


def _bypass_state(reason: str) -> State:
    if not reason:
        raise ValueError("a bypass of row-level security names its reason")
    logger.debug("row-level security bypassed: %s", reason)
    return ("", reason)


def bypass(reason: str) -> AbstractContextManager[None]:
    """Every owner's rows, for the block: the admin and cross-owner maintenance only."""
    return running_as(_bypass_state(reason))


def nobody() -> AbstractContextManager[None]:
    """Neither an owner nor a bypass (what a request or a task starts from)."""
    return running_as(NOBODY)


def maintenance(reason: str) -> Callable[[F], F]:
    """Mark a background task that works across owners (a sweep, an indexer): it runs
    under ``bypass(reason)``, queued or called directly (a command, a test's worker). A
    task queued for an owner runs as that owner; any other task, as nobody."""

    def mark(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with bypass(reason):
                return fn(*args, **kwargs)

        return cast(F, run)

    return mark


def for_task(group: str | None) -> State:
    """What a background task starts as: its owner (django-q2 group ``owner:<id>``), or
    nobody (a ``maintenance`` task then bypasses by itself)."""
    if group and group.startswith(OWNER_GROUP):
        return (str(int(group[len(OWNER_GROUP) :])), "")
    return NOBODY


def bound(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` run as what runs now, wherever it runs (a search's second leg, on a pool
    thread, whose context is not this one)."""
    value = state()

    def run() -> T:
        with running_as(value):
            return fn()

    return run


def carried(iterable: Iterable[T], value: State) -> Iterator[T]:
    """``iterable``'s items, each produced as ``value`` (a streamed response's body is
    produced after its request's middleware returned); and its closing, when the client
    went away before the end, as ``value`` too: what the body does then (the proxy
    counts the upstream call's usage) ran as nobody, and row-level security refused it
    (``invalid input syntax for type integer: ""``, the owner setting empty)."""
    iterator = iter(iterable)
    try:
        while True:
            token = _state.set(value)
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                _state.reset(token)
            yield item
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:  # (a no-op for one read to its end)
            token = _state.set(value)
            try:
                close()
            finally:
                _state.reset(token)


async def carried_async(iterable: AsyncIterable[T], value: State) -> AsyncIterator[T]:
    iterator = aiter(iterable)
    try:
        while True:
            token = _state.set(value)
            try:
                item = await anext(iterator)
            except StopAsyncIteration:
                return
            finally:
                _state.reset(token)
            yield item
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            token = _state.set(value)
            try:
                await aclose()
            finally:
                _state.reset(token)


# Commands that serve owners (each request, task or MCP session says whose rows it
# touches): they start as nobody. Every other command is the operator's, like the
# admin: it works across owners, under a bypass named after it.
SERVING_COMMANDS = frozenset({"serve", "worker", "qcluster", "runserver", "mcp"})


def for_command(argv: list[str]) -> None:
    """What a ``manage.py`` process runs as, all its threads included."""
    command = argv[1] if len(argv) > 1 else "help"
    if command not in SERVING_COMMANDS:
        set_fallback(("", f"manage.py {command}"))
