"""A context variable set for the length of a block: whose work the calls inside are
(``core.usage``), who acts (``core.audit``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def context_set(var: ContextVar[T], value: T | None) -> Iterator[None]:
    """``var`` is ``value`` inside the block, as it was after it (None changes nothing)."""
    token = var.set(value) if value is not None else None
    try:
        yield
    finally:
        if token is not None:
            var.reset(token)
