"""Scopes (namespaces) of facts: paths such as ``["user", "u-123"]`` or
``["org", "acme", "agent-alpha"]``, always inside the caller's tenant (owner). Each is
one ``Scope`` row.

A template such as ``["memories", "{user_id}"]`` is filled from request values; a value
it names and the request does not carry is a 400 (``scope_value_missing``), never a
silently shared scope. The end user ``alice`` of personal memories is the scope
``["user", "alice"]``: every door reads and writes the same row and facts. The owner's
global memories are the facts of its owner-level scope, the empty path (no client can
send it: a path has 1-8 segments).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.errors import InvalidInput
from core.key_limits import scope_check
from core.validation import END_USER_ID, validate_end_user_id
from memories.facts.models import Scope

ScopePath = tuple[str, ...]

MAX_SEGMENTS = 8
# A segment is what an end-user id may be (letters, digits, . _ : @ / + = -).
SEGMENT = END_USER_ID
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
USER = "user"


class ScopeValueMissing(InvalidInput):
    code = "scope_value_missing"


LAST_SEEN_RESOLUTION = timedelta(minutes=5)


def scope_parse(value: Any, *, field: str = "scope") -> ScopePath:
    """A validated scope from a client value (a list of 1-8 id-like strings), in reach of
    the request's key (a key narrowed to a scope: a 403 ``key_limit`` outside it)."""
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
    scope_check(tuple(value))
    return tuple(value)


def scope_fill(
    template: Sequence[Any], values: Mapping[str, Any], *, field: str = "scope"
) -> ScopePath:
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


def user_scope(external_id: str) -> ScopePath:
    return (USER, external_id)


def external_id_of(scope: ScopePath) -> str | None:
    """The end-user id when ``scope`` is ``["user", <id>]``, else None."""
    return scope[1] if len(scope) == 2 and scope[0] == USER else None


def scope_find(*, owner: AbstractBaseUser | int, scope: ScopePath) -> Scope | None:
    """The owner's row for the path ``scope``, if any."""
    return Scope.objects.filter(owner_id=owner_pk(owner), path=list(scope)).first()


def scope_ensure(*, owner: AbstractBaseUser | int, scope: ScopePath) -> Scope:
    """The owner's row for the path ``scope``, created on first use (race-safe).

    A user scope is created with its end-user id, so the engine and the personal
    memories API (``/api/v1/users/{id}/memories``) share one row.
    """
    return _ensure(owner_pk(owner), scope_parse(list(scope)))


def global_scope_ensure(*, owner: AbstractBaseUser | int) -> Scope:
    """The owner's global memories' scope (the empty path), created on first use."""
    return _ensure(owner_pk(owner), Scope.GLOBAL)


def global_scope_find(*, owner: AbstractBaseUser | int) -> Scope | None:
    return scope_find(owner=owner, scope=Scope.GLOBAL)


def _ensure(owner_id: int, path: ScopePath, made_by: uuid.UUID | None = None) -> Scope:
    """The scope, created if need be (race-safe), ``made_by`` the request making it
    (``end_user_made``). One made by another request that may yet take it back is
    claimed first, so it no longer can; one taken back meanwhile is made again."""
    scope_check(path)  # (an end user, the global memories: not parsed from a client's list)
    for _ in range(5):
        found = Scope.objects.filter(owner_id=owner_id, path=list(path)).first()
        if found is not None:
            if found.made_by is None or found.made_by == made_by:
                return found
            claimed = Scope.objects.filter(pk=found.pk, made_by=found.made_by)
            if claimed.update(made_by=None) or Scope.objects.filter(pk=found.pk).exists():
                found.made_by = None
                return found
            continue  # taken back by its failed request meanwhile: made again
        try:
            with transaction.atomic():
                return Scope.objects.create(
                    owner_id=owner_id, path=list(path), external_id=external_id_of(path),
                    made_by=made_by,
                )  # fmt: skip
        except IntegrityError:  # created meanwhile by another request
            continue
    raise RuntimeError(f"scope {list(path)} of owner {owner_id} kept changing")


def end_user_ensure(
    *, owner: AbstractBaseUser | int, external_id: str, made_by: uuid.UUID | None = None
) -> Scope:
    """The scope ``["user", external_id]`` of the owner's end user, created on first
    sight (race-safe), its ``last_seen_at`` kept to the minutes. ``made_by``: the chat
    request that may take it back (``end_user_unmake``) if it made it and then fails."""
    validate_end_user_id(external_id)
    scope = _ensure(owner_pk(owner), user_scope(external_id), made_by)
    now = timezone.now()
    # A write (and its commit) on every chat request would dominate the proxy's
    # latency; minutes are resolution enough for "last seen".
    if scope.last_seen_at is None or now - scope.last_seen_at > LAST_SEEN_RESOLUTION:
        Scope.objects.filter(pk=scope.pk).update(last_seen_at=now)
        scope.last_seen_at = now
    return scope


def end_user_unmake(scope: Scope, made_by: uuid.UUID) -> bool:
    """Delete the end user that the request ``made_by`` made, now that it failed (its
    upstream did not answer): a failed request writes nothing. Only while it is still
    that request's, unclaimed by any other use (``_ensure``), and while no row refers to
    it (its foreign keys, checked as the delete commits); never inside a transaction of
    the caller's, where that check would come too late. Whether it was deleted."""
    if connection.in_atomic_block:
        return False
    try:  # (SQL, not the ORM's delete, which would delete what refers to it first)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {Scope._meta.db_table} WHERE id = %s AND owner_id = %s "
                "AND made_by = %s",
                [scope.pk, scope.owner_id, made_by],
            )
            deleted = cursor.rowcount
    except IntegrityError:  # a fact, a change... of it since: it is in use
        return False
    return deleted == 1
