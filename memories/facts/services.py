"""Writes for personal memories. Every change of a user's memories writes an audit row.

Concurrency: writes for one end user take a transaction-scoped advisory lock on
that user and re-check duplicates under it, so two requests extracting the same
fact at once leave one memory.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from core.db import advisory_xact_lock
from core.erasure import send_scope_erased
from core.errors import InvalidInput
from core.metrics import counter_add
from core.providers.embeddings import Embedder, get_embedder
from core.validation import validate_end_user_id
from memories.conversations.selectors import flow_find, session_ids_with_sender
from memories.conversations.services import sessions_delete_rows
from memories.facts.models import (
    EndUser,
    MemoryUpdate,
    UserVector,
    Vector,
)
from memories.facts.selectors import memory_search

MAX_MEMORY_CHARS = 2000
LAST_SEEN_RESOLUTION = timedelta(minutes=5)


class MemoryServiceError(InvalidInput):
    pass


def normalize_fact(text: str) -> str:
    """Lower-case, NFKC, collapsed whitespace, no trailing punctuation: the exact-dup key."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"\s+", " ", text).strip()
    return text.rstrip(" .!?;:")


def validate_content(content: str) -> str:
    content = (content or "").strip()
    if not content:
        raise MemoryServiceError("memory text may not be blank")
    if len(content) > MAX_MEMORY_CHARS:
        raise MemoryServiceError(f"memory text is longer than {MAX_MEMORY_CHARS} characters")
    return content


def end_user_ensure(*, owner: User | Any, external_id: str) -> EndUser:
    """The owner's end user with this id, created on first sight (race-safe)."""
    validate_end_user_id(external_id)
    owner_id = getattr(owner, "pk", owner)
    end_user, _ = EndUser.objects.get_or_create(
        owner_id=owner_id, external_id=external_id, defaults={"scope": ["user", external_id]}
    )
    now = timezone.now()
    # A write (and its commit) on every chat request would dominate the proxy's
    # latency; minutes are resolution enough for "last seen".
    if end_user.last_seen_at is None or now - end_user.last_seen_at > LAST_SEEN_RESOLUTION:
        EndUser.objects.filter(pk=end_user.pk).update(last_seen_at=now)
        end_user.last_seen_at = now
    return end_user


def _user_lock(end_user: EndUser) -> None:
    advisory_xact_lock(f"memories:{end_user.pk}")


def _embedding_of(content: str, embedder: Embedder | None) -> tuple[list[float], Embedder]:
    embedder = embedder or get_embedder()
    return [float(x) for x in embedder.embed([content])[0]], embedder


class _HasModel(Protocol):
    model: str


def _new_vector(
    owner_id: int, content: str, embedding: Sequence[float], embedder: _HasModel,
    observed_at: datetime | None, type_: str = Vector.Type.MEMORY, metadata: dict | None = None,
    *, scope: EndUser | None, **fields: Any,
) -> Vector:  # fmt: skip
    """A new vector; ``scope`` is the one scope it is about to be linked to (None for
    a global memory)."""
    return Vector.objects.create(
        owner_id=owner_id, content=content, normalized=normalize_fact(content), type=type_,
        embedding=list(embedding), embedding_model=embedder.model, dimensions=len(embedding),
        observed_at=observed_at or timezone.now(), metadata=metadata or {}, scope=scope,
        **fields,
    )  # fmt: skip


def find_exact_duplicate(*, end_user: EndUser, content: str) -> Vector | None:
    return Vector.objects.filter(
        owner_id=end_user.owner_id, links__end_user=end_user, normalized=normalize_fact(content)
    ).first()


def find_duplicate(
    *,
    end_user: EndUser,
    content: str,
    embedding: Sequence[float],
    embedder: Embedder,
    threshold: float,
) -> tuple[str, Vector] | None:
    """('exact', vector) or ('semantic', vector) if the user already has this fact."""
    exact = find_exact_duplicate(end_user=end_user, content=content)
    if exact is not None:
        return "exact", exact
    nearest = memory_search(
        owner_id=end_user.owner_id,
        end_user=end_user,
        vector=embedding,
        embedding_model=embedder.model,
        top_k=1,
    )
    if nearest and nearest[0].similarity >= threshold:
        return "semantic", Vector.objects.get(pk=nearest[0].id)
    return None


def memory_add(
    *,
    end_user: EndUser,
    content: str,
    reason: str = "",
    observed_at: datetime | None = None,
    embedding: Sequence[float] | None = None,
    embedder: Embedder | None = None,
    dedup_threshold: float | None = None,
    metadata: dict | None = None,
) -> tuple[Vector | None, str | None]:
    """Store a fact for ``end_user``: a new vector, its link and an ``add`` audit row.

    With ``dedup_threshold`` the duplicate check runs under the user's lock and
    a duplicate returns ``(existing vector, "exact" | "semantic")`` without
    writing. Otherwise returns ``(new vector, None)``.
    """
    content = validate_content(content)
    if dedup_threshold is not None:
        exact = find_exact_duplicate(end_user=end_user, content=content)
        if exact is not None:  # cheap check first: no embedding needed
            return exact, "exact"
    if embedding is None:
        embedding, embedder = _embedding_of(content, embedder)
    embedder = embedder or get_embedder()
    with transaction.atomic():
        _user_lock(end_user)
        if dedup_threshold is not None:
            dup = find_duplicate(
                end_user=end_user,
                content=content,
                embedding=embedding,
                embedder=embedder,
                threshold=dedup_threshold,
            )
            if dup is not None:
                return dup[1], dup[0]
        vector = _new_vector(
            end_user.owner_id, content, embedding, embedder, observed_at, metadata=metadata,
            scope=end_user,
        )  # fmt: skip
        UserVector.objects.create(end_user=end_user, vector=vector)
        MemoryUpdate.objects.create(
            end_user=end_user,
            new_vector=vector,
            new_content=content,
            action=MemoryUpdate.Action.ADD,
            reason=reason,
        )
    counter_add("memory_additions_total")
    return vector, None


def memory_replace(
    *,
    end_user: EndUser,
    old: Vector,
    content: str,
    reason: str,
    observed_at: datetime | None = None,
    embedding: Sequence[float] | None = None,
    embedder: Embedder | None = None,
) -> Vector | None:
    """Supersede ``old`` for this user only: link a new vector, unlink the old one,
    and write a ``replace`` audit row with the reason. The old vector stays for
    other users who share it. Returns None if ``old`` is no longer linked to the
    user (another request replaced it first)."""
    content = validate_content(content)
    if embedding is None:
        embedding, embedder = _embedding_of(content, embedder)
    embedder = embedder or get_embedder()
    with transaction.atomic():
        _user_lock(end_user)
        removed, _ = UserVector.objects.filter(end_user=end_user, vector=old).delete()
        if not removed:
            return None
        vector = _new_vector(
            end_user.owner_id, content, embedding, embedder, observed_at, scope=end_user
        )
        UserVector.objects.create(end_user=end_user, vector=vector)
        MemoryUpdate.objects.create(
            end_user=end_user,
            old_vector=old,
            new_vector=vector,
            old_content=old.content,
            new_content=content,
            action=MemoryUpdate.Action.REPLACE,
            reason=reason,
        )
        _delete_if_orphan(old)
    counter_add("memory_replacements_total")
    return vector


def memory_update(
    *,
    end_user: EndUser,
    vector: Vector,
    content: str | None = None,
    reason: str = "edited",
    category: str | None = None,
    confidence: float | None = None,
) -> Vector:
    """Change a memory's text, category or confidence for this user (audited). A vector
    shared with other users is not changed under them: this user gets a new vector
    instead (copy on write). A new text is re-embedded outside the transaction."""
    content = validate_content(content) if content is not None else None
    embedding, embedder = _embedding_of(content, None) if content is not None else (None, None)
    fields: dict[str, Any] = {}
    if category is not None:
        fields["category"] = category
    if confidence is not None:
        fields["confidence"] = confidence
    with transaction.atomic():
        _user_lock(end_user)
        vector = Vector.objects.get(pk=vector.pk)  # as it is now, under the lock
        shared = UserVector.objects.filter(vector=vector).exclude(end_user=end_user).exists()
        old_content = vector.content
        text = content if content is not None else vector.content
        if shared:
            UserVector.objects.filter(end_user=end_user, vector=vector).delete()
            keep = {"category": vector.category, "confidence": vector.confidence,
                    "source_kind": vector.source_kind, "source_ref": vector.source_ref}  # fmt: skip
            new = _new_vector(
                end_user.owner_id, text,
                embedding if embedding is not None else vector.embedding,
                embedder or _ModelOf(vector), timezone.now(), scope=end_user,
                **{**keep, **fields},
            )  # fmt: skip
            UserVector.objects.create(end_user=end_user, vector=new)
        else:
            new = vector
            if embedding is not None and embedder is not None:
                fields.update(
                    content=text, normalized=normalize_fact(text), embedding=embedding,
                    embedding_model=embedder.model, dimensions=len(embedding),
                    observed_at=timezone.now(),
                )  # fmt: skip
            Vector.objects.filter(pk=vector.pk).update(**fields, updated_at=timezone.now())
            new.refresh_from_db()
        MemoryUpdate.objects.create(
            end_user=end_user, old_vector=vector, new_vector=new, old_content=old_content,
            new_content=text, action=MemoryUpdate.Action.UPDATE, reason=reason,
        )  # fmt: skip
    return new


class _ModelOf:
    """The embedder a stored vector came from (its model name), for copying it."""

    def __init__(self, vector: Vector):
        self.model = vector.embedding_model


def _delete_if_orphan(vector: Vector) -> None:
    if vector.type == Vector.Type.MEMORY and not UserVector.objects.filter(vector=vector).exists():
        Vector.objects.filter(pk=vector.pk).delete()


def memory_delete(*, end_user: EndUser, vector: Vector, reason: str = "deleted") -> None:
    """Unlink a memory from this user (audited); the vector goes when nobody links it."""
    with transaction.atomic():
        _user_lock(end_user)
        UserVector.objects.filter(end_user=end_user, vector=vector).delete()
        MemoryUpdate.objects.create(
            end_user=end_user,
            old_vector=vector,
            old_content=vector.content,
            action=MemoryUpdate.Action.DELETE,
            reason=reason,
        )
        _delete_if_orphan(vector)


def end_user_erase(*, end_user: EndUser) -> int:
    """Erasure: remove every memory link of the user (the scope), the vectors nobody
    else links, the audit trail and the scope row, and what other rooms keep of the
    scope (``core.erasure.scope_erased``: the engine's pending updates, summaries,
    journal, MEMORY.md and dream diaries), and the chats the chat proxy recorded for
    the user (``CHAT_PROXY_FLOW``). Returns the number of memories removed."""
    with transaction.atomic():
        _user_lock(end_user)
        send_scope_erased(
            sender=EndUser,
            owner_id=end_user.owner_id,
            scope_id=end_user.pk,
            scope=list(end_user.scope),
        )
        _chats_erase(end_user)
        vector_ids = list(
            UserVector.objects.filter(end_user=end_user).values_list("vector_id", flat=True)
        )
        UserVector.objects.filter(end_user=end_user).delete()
        Vector.objects.filter(pk__in=vector_ids, type=Vector.Type.MEMORY).exclude(
            pk__in=UserVector.objects.values("vector_id")
        ).delete()
        MemoryUpdate.objects.filter(end_user=end_user).delete()
        end_user.delete()
    return len(vector_ids)


def _chats_erase(end_user: EndUser) -> None:
    flow = flow_find(owner_id=end_user.owner_id, name=settings.CHAT_PROXY_FLOW)
    if flow is None or not end_user.external_id:
        return
    chats = session_ids_with_sender(flow=flow, sender=end_user.external_id[:100])
    if chats:
        sessions_delete_rows(flow=flow, session_ids=chats)


def memory_link(*, end_user: EndUser, vector: Vector, reason: str = "shared") -> None:
    """Share an existing memory with another user of the same owner."""
    if vector.owner_id != end_user.owner_id:
        raise MemoryServiceError("unknown memory")
    with transaction.atomic():
        _user_lock(end_user)
        _, created = UserVector.objects.get_or_create(end_user=end_user, vector=vector)
        if created:
            # Linked to two scopes or more now: found through its links, not its scope.
            Vector.objects.filter(pk=vector.pk).update(scope=None)
            UserVector.objects.filter(vector=vector).update(shared=True)
            MemoryUpdate.objects.create(
                end_user=end_user,
                new_vector=vector,
                new_content=vector.content,
                action=MemoryUpdate.Action.ADD,
                reason=reason,
            )


def global_memory_create(*, owner: User, content: str) -> Vector:
    """A community/system fact shown to every user of the owner with few personal memories."""
    content = validate_content(content)
    embedding, embedder = _embedding_of(content, None)
    return _new_vector(
        owner.pk, content, embedding, embedder, timezone.now(), type_=Vector.Type.GLOBAL,
        scope=None,
    )  # fmt: skip


def global_memory_delete(*, vector: Vector) -> None:
    if vector.type != Vector.Type.GLOBAL:
        raise MemoryServiceError("not a global memory")
    vector.delete()
