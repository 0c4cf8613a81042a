"""Writes for accounts and API keys."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from core.audit import access_record
from core.errors import Conflict, InvalidInput
from core.key_limits import (
    LIMIT_NAMES,
    RESOURCE_KINDS,
    key_outlives_check,
    limits_parse,
    unknown_of,
)
from core.models import APIKey
from core.validation import END_USER_ID

KEY_PREFIX = "mem_"


def api_key_digest(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def api_key_create(
    *, owner: User, name: str = "", read_only: bool = False, expires_at: datetime | None = None,
    limits: Mapping[str, Any] | None = None,
) -> tuple[APIKey, str]:  # fmt: skip
    """Create an API key for ``owner`` and return the row and the raw key, narrowed to
    reading (``read_only``), ending at ``expires_at`` and held to ``limits`` (named
    knowledge bases, memory bases, flows, memory stores, a scope, tools:
    ``core.key_limits``) when asked. An expiry that is not in the future, an unknown
    limit name, a limit of the wrong shape, an id that is not one of the owner's
    resources or an unknown tool is an ``InvalidInput`` naming the field, and nothing
    is created. Creation is recorded in the audit trail, and so is the narrowing.

    The raw key is shown to the caller exactly once; only its digest is stored.
    """
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput("expires_at must be in the future",
                           details={"expires_at": "not in the future"})  # fmt: skip
    narrowed = api_key_limits_clean(owner_id=owner.pk, limits=limits)
    key_outlives_check(expires_at, doing="make")
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        api_key = APIKey.objects.create(
            owner=owner, name=name, prefix=raw_key[:12], digest=api_key_digest(raw_key),
            read_only=read_only, expires_at=expires_at, **narrowed,
        )  # fmt: skip
        detail = {
            "read_only": read_only,
            "expires_at": expires_at.isoformat() if expires_at else None,
        }
        access_record(owner_id=owner.pk, action="key_created", subject_key_id=api_key.pk,
                      detail=detail)  # fmt: skip
        if any(v is not None for v in narrowed.values()):
            access_record(owner_id=owner.pk, action="key_narrowed", subject_key_id=api_key.pk,
                          detail=_narrowing(narrowed))  # fmt: skip
    return api_key, raw_key


def api_key_limits_clean(*, owner_id: int, limits: Mapping[str, Any] | None) -> dict[str, Any]:
    """``limits`` as the key's columns (each name, None when not given), checked: the
    shape (``limits_parse``), the scope's segments, and that every id names one of the
    owner's resources and every tool exists. ``InvalidInput`` names each bad field."""
    parsed = limits_parse(limits)
    errors: dict[str, str] = {}
    for segment in parsed.get("scope") or ():
        if not END_USER_ID.matches(segment):
            errors["limits.scope"] = f"invalid segment {segment!r}: {END_USER_ID.message}"
    for kind in (*RESOURCE_KINDS, "tools"):
        if parsed.get(kind):
            unknown = unknown_of(kind)(owner_id, parsed[kind])
            if unknown:
                what = "tools" if kind == "tools" else f"your {kind.replace('_', ' ')}"
                errors[f"limits.{kind}"] = f"not {what}: {', '.join(map(str, unknown))}"
    if errors:
        raise InvalidInput("invalid limits: " + "; ".join(f"{k}: {v}" for k, v in errors.items()),
                           details=errors)  # fmt: skip
    return {name: parsed.get(name) for name in LIMIT_NAMES}


def _narrowing(narrowed: dict[str, Any]) -> dict[str, Any]:
    """What the audit trail keeps of a narrowing: the ids and tool names, and of the
    scope only its length (a scope's path may hold an end user's id)."""
    kept: dict[str, Any] = {
        k: [str(v) for v in narrowed[k]] for k in (*RESOURCE_KINDS, "tools")
        if narrowed[k] is not None
    }  # fmt: skip
    if narrowed["scope"] is not None:
        kept["scope_segments"] = len(narrowed["scope"])
    return kept


def api_key_revoke(*, api_key: APIKey) -> APIKey:
    """Revoke a key; revoking an already revoked key keeps its first revocation time
    (and its one record in the audit trail). A key that ends revokes only keys that end
    no later (``key_outlives_check``)."""
    key_outlives_check(api_key.expires_at, doing="revoke")
    with transaction.atomic():
        revoked = APIKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if revoked:
            access_record(owner_id=api_key.owner_id, action="key_revoked",
                          subject_key_id=api_key.pk)  # fmt: skip
    api_key.refresh_from_db()
    return api_key


def admin_ensure(*, username: str = "admin", password: str | None = None) -> str | None:
    """Create a superuser if the database has none; return the password if one was made.

    The password is returned (and printed by the caller) exactly once; later calls
    find the superuser and return None.
    """
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    if user_model.objects.filter(is_superuser=True).exists():
        return None
    if user_model.objects.filter(username=username).exists():  # (an owner: never promoted)
        raise Conflict(
            f"a user named {username!r} exists and is no superuser (an API owner made by "
            "create_api_key --create-user?): set ADMIN_USERNAME to another name, or make "
            "a superuser with manage.py createsuperuser"
        )
    password = password or secrets.token_urlsafe(12)
    user_model.objects.create_superuser(username=username, email="", password=password)
    return password
