"""The audit trail of access: who created, revoked and used keys to erase, from where.

``AccessEvent`` rows record each API key created or revoked and each erasure (an end
user's or a scope's memories, a session's messages): the owner, the action, who acted
(``key:<prefix>``, ``admin:<username>``, ``user:<username>``, ``command``,
``service``), the key that acted, the client's address and when, with counts in
``detail``; never memory content, a scope's path, an end user's id or a session's id.
It is the one record of each erasure: the rooms that erase keep none of their own.

Who acts is the request being served: ``core.middleware.AccessActorMiddleware`` makes it
current for the request's duration, the API key authentication marks the key on it, and
``actor()`` reads them when an event is recorded (nothing is read for requests that
record none). Work outside a request (commands, tasks) is ``service`` unless it says
otherwise (``acting_as``).
"""

from __future__ import annotations

import ipaddress
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest

from core.context import context_set

if TYPE_CHECKING:
    from core.key_limits import KeyLimits

KEY_ATTRIBUTE = "access_key"  # set on the HttpRequest by the API key authentication


@dataclass(frozen=True)
class Actor:
    who: str
    key_id: int | None = None
    address: str | None = None
    read_only: bool = False  # a read-only key acts (``core.api.permissions``)
    limits: KeyLimits | None = None  # a narrowed key acts (``core.key_limits``)
    expires_at: datetime | None = None  # a key that ends acts (``core.key_limits``)


_current: ContextVar[Actor | HttpRequest | None] = ContextVar("access_actor", default=None)


def actor() -> Actor:
    """Who is acting now."""
    current = _current.get()
    if current is None:
        return Actor("service")
    if isinstance(current, Actor):
        return current
    return _of_request(current)


def _of_request(request: HttpRequest) -> Actor:
    address = _address(request.META.get("REMOTE_ADDR") or "")
    key = getattr(request, KEY_ATTRIBUTE, None)
    if key is not None:
        from core.key_limits import KeyLimits

        return Actor(f"key:{key.prefix}", key.pk, address, key.read_only, KeyLimits.of(key),
                     key.expires_at)  # fmt: skip
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        role = "admin" if user.is_staff else "user"
        return Actor(f"{role}:{user.get_username()}", None, address)
    return Actor("anonymous", None, address)


def _address(value: str) -> str | None:
    """The client's IP address (None for what is not one: a unix socket's peer)."""
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None


def request_begin(request: HttpRequest) -> Token[Actor | HttpRequest | None]:
    return _current.set(request)


def request_end(token: Token[Actor | HttpRequest | None]) -> None:
    _current.reset(token)


def acting_as(who: Actor | None) -> AbstractContextManager[None]:
    """The work inside is ``who``'s (None changes nothing)."""
    return context_set(_current, who)


def access_record(
    *, owner_id: int, action: str, subject_key_id: int | None = None,
    detail: dict[str, Any] | None = None,
) -> Any:  # fmt: skip
    """Record ``action`` on ``owner_id``'s data by whoever acts now (in the caller's
    transaction, when there is one: an erasure rolled back leaves no record)."""
    from core.models import AccessEvent

    who = actor()
    return AccessEvent.objects.create(
        owner_id=owner_id, action=action, actor=who.who[:200], key_id=who.key_id,
        subject_key_id=subject_key_id, address=who.address, detail=detail or {},
    )  # fmt: skip
