"""Scopes (namespaces) of memories: lists such as ``["user", "u-123"]`` or
``["org", "acme", "agent-alpha"]``, always inside the caller's tenant (owner).

A template such as ``["memories", "{user_id}"]`` is filled from request values; a value
it names and the request does not carry is a 400 (``scope_value_missing``), never a
silently shared scope. The end user ``alice`` of personal memories is the scope
``["user", "alice"]``: both paths read and write the same row and facts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from core.errors import InvalidInput
from core.validation import END_USER_ID
from memories.facts.models import EndUser

Scope = tuple[str, ...]

MAX_SEGMENTS = 8
# A segment is what an end-user id may be (letters, digits, . _ : @ / + = -).
SEGMENT = END_USER_ID
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
USER = "user"


class ScopeValueMissing(InvalidInput):
    code = "scope_value_missing"


def scope_parse(value: Any, *, field: str = "scope") -> Scope:
    """A validated scope from a client value (a list of 1-8 id-like strings)."""
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_SEGMENTS:
        raise InvalidInput(
            f"{field} must be a list of 1 to {MAX_SEGMENTS} strings",
            details={field: 'a list such as ["user", "u-123"]'},
        )
    for segment in value:
        if not SEGMENT.matches(segment):
            raise InvalidInput(
                f"{field} segment {segment!r} is not valid: {SEGMENT.message}",
                details={field: f"invalid segment {segment!r}"},
            )
    return tuple(value)


def scope_fill(
    template: Sequence[Any], values: Mapping[str, Any], *, field: str = "scope"
) -> Scope:
    """Fill ``{name}`` placeholders of a scope template from ``values``, then validate.

    A placeholder without a (non-empty) value raises ``ScopeValueMissing`` naming it.
    """
    if not isinstance(template, list | tuple):
        return scope_parse(template, field=field)
    filled, missing = [], []
    for segment in template:
        if not isinstance(segment, str):
            return scope_parse(template, field=field)  # reports the bad segment

        def replace(match: re.Match[str]) -> str:
            value = values.get(match.group(1))
            if value is None or str(value) == "":
                missing.append(match.group(1))
                return ""
            return str(value)

        filled.append(PLACEHOLDER.sub(replace, segment))
    if missing:
        names = ", ".join(sorted(set(missing)))
        raise ScopeValueMissing(
            f"the scope template needs a value for {names}",
            details={field: f"no value for {names}", "missing": sorted(set(missing))},
        )
    return scope_parse(filled, field=field)


def owner_pk(owner: AbstractBaseUser | int) -> int:
    """An owner given as a user or as its id."""
    return int(owner if isinstance(owner, int) else owner.pk)


def user_scope(external_id: str) -> Scope:
    return (USER, external_id)


def external_id_of(scope: Scope) -> str | None:
    """The end-user id when ``scope`` is ``["user", <id>]``, else None."""
    return scope[1] if len(scope) == 2 and scope[0] == USER else None


def scope_find(*, owner: AbstractBaseUser | int, scope: Scope) -> EndUser | None:
    owner_id = owner_pk(owner)
    return EndUser.objects.filter(owner_id=owner_id, scope=list(scope)).first()


def scope_ensure(*, owner: AbstractBaseUser | int, scope: Scope) -> EndUser:
    """The owner's row for ``scope``, created on first use (race-safe).

    A user scope is created through the end-user id, so the engine and the personal
    memories API (``/api/v1/users/{id}/memories``) share one row.
    """
    owner_id = owner_pk(owner)
    scope = scope_parse(list(scope))
    external_id = external_id_of(scope)
    found = EndUser.objects.filter(owner_id=owner_id, scope=list(scope)).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            return EndUser.objects.create(
                owner_id=owner_id, scope=list(scope), external_id=external_id
            )
    except IntegrityError:  # created meanwhile by another request
        return EndUser.objects.get(owner_id=owner_id, scope=list(scope))
