"""Writes for accounts and API keys."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from core.audit import access_record
from core.errors import InvalidInput
from core.models import APIKey

KEY_PREFIX = "mem_"


def api_key_digest(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def api_key_create(
    *, owner: User, name: str = "", read_only: bool = False, expires_at: datetime | None = None
) -> tuple[APIKey, str]:
    """Create an API key for ``owner`` and return the row and the raw key, narrowed to
    reading (``read_only``) and ending at ``expires_at`` when asked. An expiry that is
    not in the future is an ``InvalidInput`` naming it, and nothing is created.

    The raw key is shown to the caller exactly once; only its digest is stored.
    """
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput("expires_at must be in the future",
                           details={"expires_at": "not in the future"})  # fmt: skip
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        api_key = APIKey.objects.create(
            owner=owner, name=name, prefix=raw_key[:12], digest=api_key_digest(raw_key),
            read_only=read_only, expires_at=expires_at,
        )  # fmt: skip
        detail = {
            "read_only": read_only,
            "expires_at": expires_at.isoformat() if expires_at else None,
        }
        access_record(owner_id=owner.pk, action="key_created", subject_key_id=api_key.pk,
                      detail=detail)  # fmt: skip
    return api_key, raw_key


def api_key_revoke(*, api_key: APIKey) -> APIKey:
    """Revoke a key; revoking an already revoked key keeps its first revocation time
    (and its one record in the audit trail)."""
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
    password = password or secrets.token_urlsafe(12)
    user_model.objects.create_superuser(username=username, email="", password=password)
    return password
