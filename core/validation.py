"""One validator each for the ids clients choose: session ids, end-user ids, node ids.

Each kind has one pattern and one message, used by the services (``validate_*``) and,
for session ids, the API field and the URL converter built from it. (Node ids in URLs
are checked by the service, which answers 400 rather than the converter's 404.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from core.errors import InvalidInput


@dataclass(frozen=True)
class IdKind:
    name: str
    regex: str  # unanchored, for URL converters
    message: str
    code: str = "invalid"

    @property
    def max_length(self) -> int:
        return int(self.regex.rsplit(",", 1)[1].rstrip("}")) + 1

    def matches(self, value: object) -> bool:
        return isinstance(value, str) and re.fullmatch(self.regex, value) is not None

    def validate(self, value: Any) -> str:
        if not self.matches(value):
            raise InvalidInput.at(self.name, self.message, code=self.code)
        return value


SESSION_ID = IdKind(
    "session_id",
    r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,254}",
    "must be 1-255 characters: letters, digits and . _ : @ / + = -, "
    "starting with a letter or digit",
)
END_USER_ID = IdKind(
    "user",
    r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,254}",
    "must be 1-255 characters: letters, digits and . _ : @ / + = -, "
    "starting with a letter or digit",
    code="invalid_user",
)
NODE_ID = IdKind(
    "node_id",
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}",
    "must be 1-128 letters, digits and . _ -, starting with a letter or digit",
)


def validate_session_id(session_id: Any) -> str:
    return SESSION_ID.validate(session_id)


def validate_end_user_id(external_id: Any) -> str:
    return END_USER_ID.validate(external_id)


def validate_node_id(node_id: Any) -> str:
    return NODE_ID.validate(node_id)


class _IdField(serializers.RegexField):
    kind: IdKind

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_length", self.kind.max_length)
        super().__init__(
            f"^{self.kind.regex}$", error_messages={"invalid": self.kind.message}, **kwargs
        )

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):  # (DRF would take 12345 as "12345": a JSON string only)
            self.fail("invalid")
        return str(super().to_internal_value(data))


class SessionIdField(_IdField):
    kind = SESSION_ID


class _IdConverter:
    kind: IdKind

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class SessionIdConverter(_IdConverter):
    """A session id, slashes included (``a/b`` or ``a%2Fb`` in a URL): every route that
    takes a session id uses it, so an id ``/runs`` accepted can be read and deleted."""

    kind = SESSION_ID
    regex = SESSION_ID.regex


class EndUserIdConverter(_IdConverter):
    """An end-user id, slashes included (the chat proxy accepts them in its header).
    Anything matches here: the views validate the id, so a malformed one is a 400
    ``invalid_user`` naming the rule (each route ends in its own fixed suffix)."""

    kind = END_USER_ID
    regex = ".+"


def register_converters() -> None:
    """``<session:...>`` and ``<end_user:...>`` in URL patterns (idempotent)."""
    from django.urls import register_converter
    from django.urls.converters import get_converters

    for name, converter in (("session", SessionIdConverter), ("end_user", EndUserIdConverter)):
        if name not in get_converters():
            register_converter(converter, name)
