"""What a narrowed API key may reach (issue 30, item 2): the one place that says so.

A key may be narrowed when it is created to named knowledge bases, memory bases, flows
and memory stores, to a memory scope (``["user", "<id>"]``: one end user; a scope reaches
the paths that start with it) and to named tools. ``None`` for a kind reaches every
resource of it (every key made before limits existed is such a full key); a list only
those named (an empty list, none).

The request being served carries its key's limits (``core.audit.actor()``: the API key
authentication marks the key; MCP's tools and the chat proxy's tool loop run as the
request's actor). The selectors that turn a client's id into a row check it here, one
helper per kind of resource, so every door (REST, the tools endpoint, MCP, the chat
proxy) is held by the same check:

- ``resource_check(kind, id)`` after the owner-scoped lookup (another owner's object
  stays a 404: the check only runs on the caller's own rows), and ``resource_filter``
  for the lists (a narrowed key lists only what it may reach);
- ``resource_create_check(kind)``: a key narrowed on a kind creates none of it (what it
  created would be out of its reach);
- ``scope_check(path)`` for every scope a client names (``scope_parse``), an end user of
  the ``users/{id}`` routes and the proxy's user header (``end_user_check``);
- ``tool_check(name)`` and ``tool_allowed(name)`` for the tools;
- ``owner_wide_check()`` for what spans the whole account (export, import, API keys,
  the account's settings): only a key without resource, scope or tool limits;
- ``key_outlives_check(expires_at)``: a key that ends makes and revokes only keys that
  end no later than itself.

A memory base, and a file store, keep their content in a knowledge base of their own:
that knowledge base is the memory base's (the store's), so a key narrowed on memory bases
(stores) reaches it only when it reaches its holder, whatever its ``knowledge_bases``
(``HOLDERS``: the apps that hold one declare ``key_limit_holders``).

Reaching outside the limits is a 403 ``key_limit`` before anything is written. Work
outside a request (tasks, commands, the admin) has no key and no limits.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.apps import apps
from django.db.models import Model, QuerySet
from django.utils.module_loading import import_string

from core.errors import KeyLimitExceeded

if TYPE_CHECKING:
    from core.models import APIKey

M = TypeVar("M", bound=Model)

RESOURCE_KINDS = ("knowledge_bases", "memory_bases", "flows", "memory_stores")
HOLDERS = ("memory_bases", "memory_stores")  # kinds that keep a knowledge base of their own
LIMIT_NAMES = (*RESOURCE_KINDS, "scope", "tools")
WHAT = {
    "knowledge_bases": "knowledge base",
    "memory_bases": "memory base",
    "flows": "flow",
    "memory_stores": "memory store",
}


@dataclass(frozen=True)
class KeyLimits:
    knowledge_bases: frozenset[str] | None = None
    memory_bases: frozenset[str] | None = None
    flows: frozenset[str] | None = None
    memory_stores: frozenset[str] | None = None
    scope: tuple[str, ...] | None = None
    tools: frozenset[str] | None = None

    @classmethod
    def of(cls, key: APIKey) -> KeyLimits | None:
        """The key's limits, None for a key with none (a full key)."""
        ids = {k: _ids(getattr(key, k)) for k in RESOURCE_KINDS}
        limits = cls(
            **ids,
            scope=None if key.scope is None else tuple(key.scope),
            tools=None if key.tools is None else frozenset(key.tools),
        )
        return None if limits == cls() else limits

    def allows(self, kind: str, resource_id: Any) -> bool:
        named: frozenset[str] | None = getattr(self, kind)
        return named is None or str(resource_id) in named

    def reaches(self, path: Sequence[str]) -> bool:
        return self.scope is None or tuple(path[: len(self.scope)]) == self.scope

    def payload(self) -> dict[str, Any]:
        """As ``GET /api/v1/me`` and the key's answers show them (null: not narrowed)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = None if value is None else (
                list(value) if f.name == "scope" else sorted(value)
            )  # fmt: skip
        return out


NO_LIMITS = KeyLimits()


def _ids(value: Iterable[Any] | None) -> frozenset[str] | None:
    return None if value is None else frozenset(str(v) for v in value)


def key_limits_payload(key: APIKey) -> dict[str, Any]:
    return (KeyLimits.of(key) or NO_LIMITS).payload()


def current() -> KeyLimits | None:
    """The limits of the key the current request authenticated with, if it has any."""
    from core.audit import actor

    return actor().limits


def resource_check(kind: str, resource_id: Any) -> None:
    limits = current()
    if limits is None:
        return
    if not limits.allows(kind, resource_id):
        raise KeyLimitExceeded(
            f"this API key is limited to named {kind.replace('_', ' ')}; "
            f"{WHAT[kind]} {resource_id} is not one of them",
            details={kind: str(resource_id)},
        )
    if kind != "knowledge_bases":
        return
    for holder_kind, outside in _held_outside(limits):
        holder = outside.filter(knowledge_base_id=resource_id).values_list("pk", flat=True)
        held_by = holder.first()
        if held_by is not None:
            raise KeyLimitExceeded(
                f"this API key is limited to named {holder_kind.replace('_', ' ')}; knowledge "
                f"base {resource_id} holds {WHAT[holder_kind]} {held_by}, which is not one "
                "of them",
                details={holder_kind: str(held_by)},
            )


def _held_outside(limits: KeyLimits) -> list[tuple[str, QuerySet[Any]]]:
    """For each kind the key is narrowed on that keeps a knowledge base of its own, the
    rows of that kind (with a knowledge base) the key does not reach."""
    out = []
    for kind in HOLDERS:
        named: frozenset[str] | None = getattr(limits, kind)
        if named is not None:
            out.append((kind, _holders(kind).exclude(pk__in=sorted(named))))
    return out


def _holders(kind: str) -> QuerySet[Any]:
    """The rows of ``kind`` that keep a knowledge base (``knowledge_base_id``), from the
    function its app declares (``AppConfig.key_limit_holders = {kind: "dotted.path"}``)."""
    return _declared("key_limit_holders", kind)()  # type: ignore[no-any-return]


def resource_ids(kind: str) -> frozenset[str] | None:
    """The resources of ``kind`` the key is narrowed to (None: not narrowed)."""
    limits = current()
    return None if limits is None else getattr(limits, kind)


def resource_filter(qs: QuerySet[M], kind: str, field: str = "pk") -> QuerySet[M]:
    """``qs`` cut to the rows the key may reach (its ``field`` holds the resource id;
    knowledge bases: also those whose holder it reaches, ``HOLDERS``)."""
    limits = current()
    if limits is None:
        return qs
    named: frozenset[str] | None = getattr(limits, kind)
    if named is not None:
        qs = qs.filter(**{f"{field}__in": sorted(named)})
    if kind == "knowledge_bases":
        for _, outside in _held_outside(limits):
            qs = qs.exclude(**{f"{field}__in": outside.values("knowledge_base_id")})
    return qs


def not_owned(owned: QuerySet[Any], ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Of ``ids``, those ``owned`` (an owner's rows of a kind) does not hold."""
    found = set(owned.filter(pk__in=list(ids)).values_list("pk", flat=True))
    return [i for i in ids if i not in found]


def scope_filter(qs: QuerySet[M], field: str = "path") -> QuerySet[M]:
    """``qs`` (rows with a scope path in ``field``) cut to the paths in the key's reach."""
    limits = current()
    if limits is None or limits.scope is None:
        return qs
    return qs.filter(**{f"{field}__0_{len(limits.scope)}": list(limits.scope)})


def resource_create_check(kind: str) -> None:
    limits = current()
    if limits is not None and getattr(limits, kind) is not None:
        raise KeyLimitExceeded(
            f"this API key is limited to named {kind.replace('_', ' ')}: it creates none "
            "(create it with a key that is not limited to named ones)",
            details={kind: "limited"},
        )


def scope_check(path: Sequence[str], *, named: bool = True) -> None:
    """``path`` (a scope a client names, or the global scope ``()``) is in reach.
    ``named=False``: the scope of something the client asked for by id (a fact, a
    dream), which the refusal does not name: it told a key limited to one end user the
    path, and so the id, of another end user."""
    limits = current()
    if limits is not None and not limits.reaches(path):
        said = (list(path) if path else "the global memories") if named else "what you asked for"
        raise KeyLimitExceeded(
            f"this API key is limited to the scope {list(limits.scope or ())}; {said} is "
            "outside it",
            details={"scope": list(path) if named else None},
        )


def end_user_check(external_id: str | None) -> None:
    """An end user named by a route or the chat proxy's user header: a key limited to a
    scope serves only the end user of that scope (and a proxy request names one)."""
    limits = current()
    if limits is None or limits.scope is None:
        return
    if not external_id:
        raise KeyLimitExceeded(
            f"this API key is limited to the scope {list(limits.scope)}: name its end user "
            "(the user header)",
            details={"scope": None},
        )
    scope_check(("user", external_id))


def tool_allowed(name: str) -> bool:
    limits = current()
    return limits is None or limits.tools is None or name in limits.tools


def tool_check(name: str) -> None:
    if not tool_allowed(name):
        limits = current() or NO_LIMITS
        raise KeyLimitExceeded(
            f"this API key is limited to the tools {', '.join(sorted(limits.tools or ()))}; "
            f"{name} is not one of them",
            details={"tools": name},
        )


def key_outlives_check(expires_at: datetime | None, *, doing: str) -> None:
    """A key that ends (``expires_at``) makes, and revokes, only keys that end no later
    than itself: ``expires_at`` is the end of the key made or revoked (None: never)."""
    ends = actor_expiry()
    if ends is not None and (expires_at is None or expires_at > ends):
        raise KeyLimitExceeded(
            f"this API key expires at {ends.isoformat()}: it may not {doing} a key that "
            "outlives it",
            details={"expires_at": ends.isoformat()},
        )


def actor_expiry() -> datetime | None:
    """When the key the current request authenticated with ends (None: never, or no key)."""
    from core.audit import actor

    return actor().expires_at


def owner_wide_check() -> None:
    """What spans the whole account needs a key without resource, scope or tool limits."""
    if current() is not None:
        raise KeyLimitExceeded(
            "this API key is narrowed (to named resources, a scope or tools): it may not "
            "do what spans the whole account",
            details={"key": "narrowed"},
        )


def limits_parse(value: Any, *, field: str = "limits") -> dict[str, Any]:
    """A client's limits object checked for shape (each name known; resources lists of
    ids; ``scope`` a list of 1-8 strings; ``tools`` a list of strings): a dict of the
    given names, or ``InvalidInput`` naming the field. Whether the ids are the owner's
    and the tools exist is ``core.services.api_key_create``'s business."""
    from core.errors import InvalidInput

    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field} must be an object", details={field: "not an object"})
    errors: dict[str, str] = {}
    parsed: dict[str, Any] = {}
    for name, given in value.items():
        where = f"{field}.{name}"
        if name not in LIMIT_NAMES:
            errors[where] = f"unknown limit; the limits are {', '.join(LIMIT_NAMES)}"
        elif given is None:
            parsed[name] = None
        elif not isinstance(given, list) or not all(isinstance(v, str) for v in given):
            errors[where] = "must be a list of strings"
        elif name in RESOURCE_KINDS:
            ids = _uuids(given)
            if ids is None:
                errors[where] = "must be a list of ids"
            else:
                parsed[name] = ids
        elif name == "scope" and not 1 <= len(given) <= 8:
            errors[where] = 'must be a list of 1 to 8 strings, such as ["user", "u-123"]'
        else:
            parsed[name] = list(dict.fromkeys(given))
    if errors:
        raise InvalidInput(f"invalid {field}: " + "; ".join(f"{k}: {v}" for k, v in errors.items()),
                           details=errors)  # fmt: skip
    return parsed


def unknown_of(kind: str) -> Any:
    """The function an app declares (``AppConfig.key_limits = {kind: "dotted.path"}``)
    answering, for an owner id and the values a key names, those that are not the
    owner's (an id of another owner's or no resource, an unknown tool name)."""
    return _declared("key_limits", kind)


def _declared(attribute: str, kind: str) -> Any:
    """The function an app's ``AppConfig.<attribute>`` names for ``kind``."""
    for config in apps.get_app_configs():
        path = getattr(config, attribute, {}).get(kind)
        if path is not None:
            return import_string(path)
    raise LookupError(f"no app declares {attribute} for {kind!r}")


def _uuids(values: list[str]) -> list[uuid.UUID] | None:
    try:
        return list(dict.fromkeys(uuid.UUID(v) for v in values))
    except ValueError:
        return None
