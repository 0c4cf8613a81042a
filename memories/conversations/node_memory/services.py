"""Node memory services: append turns, read a history, clear, delete idle memory."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.files.storage import FileSystemStorage, Storage
from django.db import transaction
from django.utils import timezone

from memories.conversations.history import (
    History,
    validate_budget,
)
from memories.conversations.models import Flow
from memories.conversations.node_memory.documents import (
    _apply_turns,
    _forget,
    _history,
    _load,
    _lock,
    _mutable,
    _new_doc,
    _now_iso,
    _read,
    _read_raw,
    _storage,
    _write,
)
from memories.conversations.node_memory.values import (
    LATEST,
    ROOT,
    NodeMemoryNotFound,
    NodeTurn,
    Parent,
    TurnIn,
    _turn_in,
    node_key,
)


# --- services -----------------------------------------------------------------------
def node_memory_append_turns(
    *, flow: Flow, session_id: str, node_id: str, turns: Sequence[TurnIn]
) -> list[NodeTurn]:
    """Append turns to one node's memory, in order, all or none.

    ``flow`` must come from an owner-scoped lookup. Under the document's advisory
    lock: load (or start) the document, validate and append every turn, write it
    back once. A turn whose message id is stored already is a replay when its
    content, files and parent match (returned with ``created=False``, nothing
    written) and ``DuplicateMessage`` otherwise; a parent not in the document (or
    the turn itself) is ``UnknownParent``. On any error nothing is written.
    """
    key = node_key(flow=flow, session_id=session_id, node_id=node_id)
    storage = _storage()
    now = _now_iso(timezone.now())
    with transaction.atomic():
        _lock(key.path)
        doc = _load(storage, key)
        if doc is None:
            if storage.exists(key.path) or storage.exists(key.path + ".gz"):
                raise NodeMemoryNotFound("unknown node memory")  # another owner's document
            doc = _new_doc(key, now)
        doc = _mutable(doc)
        results = _apply_turns(doc, turns, now)
        if any(result.created for result in results):
            doc["revision"] = doc.get("revision", 0) + 1
            doc["updated_at"] = now
            _write(storage, key, doc)
    return results


def node_memory_append_turn(
    *,
    flow: Flow,
    session_id: str,
    node_id: str,
    message_id: str,
    parent_message_id: str | None | Parent = LATEST,
    user_content: str,
    assistant_content: str,
    user_files: Sequence[dict[str, Any]] = (),
    assistant_files: Sequence[dict[str, Any]] = (),
) -> NodeTurn:
    """Append one turn (user + assistant message under ``message_id``); see
    ``node_memory_append_turns`` for the rules. ``parent_message_id`` defaults to the
    newest stored turn; ``None`` starts a new thread."""
    turn = _turn_in(
        message_id=message_id,
        parent_message_id=parent_message_id,
        user_content=user_content,
        assistant_content=assistant_content,
        user_files=list(user_files),
        assistant_files=list(assistant_files),
    )
    (result,) = node_memory_append_turns(
        flow=flow, session_id=session_id, node_id=node_id, turns=[turn]
    )
    return result


def node_memory_history(
    *,
    flow: Flow,
    session_id: str,
    node_id: str,
    current_message_id: str | None = None,
    max_tokens: int | None = None,
) -> History:
    """The thread of the current turn (default: the newest) of one node's memory.

    The thread follows turn parents back to a turn without one; the oldest messages
    are dropped while it exceeds ``max_tokens`` (default ``HISTORY_MAX_TOKENS``,
    counted as in ``memories.conversations.history``), the newest message is always kept.
    Raises ``NodeMemoryNotFound`` (no document for this flow, conversation and node),
    ``UnknownMessage`` (current turn not stored) or ``HistoryError``. Reads only.
    """
    max_tokens = settings.HISTORY_MAX_TOKENS if max_tokens is None else max_tokens
    validate_budget(max_tokens=max_tokens)
    key = node_key(flow=flow, session_id=session_id, node_id=node_id)
    doc = _read(key)
    if doc is None:
        raise NodeMemoryNotFound(
            f"no memory for node {node_id!r} in conversation {session_id!r} of this flow"
        )
    return _history(doc["messages"], current_message_id, max_tokens)


def node_memory_clear(*, flow: Flow, session_id: str, node_id: str) -> int:
    """Delete one node's memory document; returns how many messages it held.

    Raises ``NodeMemoryNotFound`` when there is none (nothing is deleted then).
    """
    key = node_key(flow=flow, session_id=session_id, node_id=node_id)
    storage = _storage()
    with transaction.atomic():
        _lock(key.path)
        doc = _load(storage, key)
        if doc is None:
            raise NodeMemoryNotFound(
                f"no memory for node {node_id!r} in conversation {session_id!r} of this flow"
            )
        for name in (key.path, key.path + ".gz"):
            _forget(name)
            if storage.exists(name):
                storage.delete(name)
    return len(doc["messages"])


def node_memory_delete_idle(*, idle_days: float | None = None, now: datetime | None = None) -> int:
    """Delete the node memory of conversations idle for longer than ``idle_days``.

    A conversation's last activity is the newest modification time of its node
    documents. ``idle_days`` defaults to ``NODE_MEMORY_IDLE_DAYS``; 0 disables the
    sweep. Each document is deleted under its lock after re-checking its time, so a
    document written meanwhile survives. Returns the number of documents deleted;
    safe to run twice and alongside writers.
    """
    idle_days = settings.NODE_MEMORY_IDLE_DAYS if idle_days is None else idle_days
    if idle_days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=idle_days)
    storage = _storage()
    deleted = 0
    for directory, names in _conversation_dirs(storage):
        times = {name: _modified(storage, name) for name in names}
        if not times or max(times.values()) > cutoff:
            continue
        deleted += sum(_delete_if_idle(storage, name, cutoff) for name in names)
        _remove_empty_dirs(storage, directory)
    return deleted


def _listdir(storage: Storage, path: str) -> tuple[list[str], list[str]]:
    try:
        return storage.listdir(path)
    except FileNotFoundError:
        return [], []


def _conversation_dirs(storage: Storage) -> Iterator[tuple[str, list[str]]]:
    flows, _ = _listdir(storage, ROOT)
    for flow_dir in sorted(flows):
        conversations, _ = _listdir(storage, f"{ROOT}/{flow_dir}")
        for conversation in sorted(conversations):
            directory = f"{ROOT}/{flow_dir}/{conversation}"
            _, files = _listdir(storage, directory)
            yield directory, [f"{directory}/{name}" for name in sorted(files)]


def _modified(storage: Storage, name: str) -> datetime:
    try:
        return storage.get_modified_time(name)
    except NotImplementedError:
        doc = _read_raw(storage, name) or {}
        return datetime.fromisoformat(doc.get("updated_at", "1970-01-01T00:00:00+00:00"))


def _delete_if_idle(storage: Storage, name: str, cutoff: datetime) -> int:
    if not name.endswith((".json", ".json.gz")):  # a temp file left by a crashed write
        if storage.exists(name) and _modified(storage, name) <= cutoff:
            storage.delete(name)
        return 0
    with transaction.atomic():
        _lock(name.removesuffix(".gz"))
        if not storage.exists(name) or _modified(storage, name) > cutoff:
            return 0
        _forget(name)
        storage.delete(name)
    return 1


def _remove_empty_dirs(storage: Storage, directory: str) -> None:
    if not isinstance(storage, FileSystemStorage):
        return  # object stores have no directories
    for path in (directory, directory.rsplit("/", 1)[0]):
        try:
            os.rmdir(storage.path(path))
        except OSError:
            return  # not empty (or gone): a writer may have just created it


# --- export and import --------------------------------------------------------------
def node_memory_documents(*, flow: Flow) -> Iterator[dict[str, Any]]:
    """Every node memory document of the flow (its conversations' nodes), as stored."""
    storage = _storage()
    conversations, _ = _listdir(storage, f"{ROOT}/{flow.pk}")
    for conversation in sorted(conversations):
        _, files = _listdir(storage, f"{ROOT}/{flow.pk}/{conversation}")
        nodes = sorted({name.removesuffix(".gz").removesuffix(".json") for name in files})
        for node in nodes:
            doc = _read_raw(storage, f"{ROOT}/{flow.pk}/{conversation}/{node}.json") or _read_raw(
                storage, f"{ROOT}/{flow.pk}/{conversation}/{node}.json.gz"
            )
            if doc is not None and doc.get("owner_id") == flow.owner_id:
                yield doc


def node_memory_document_restore(*, flow: Flow, doc: dict[str, Any]) -> bool:
    """Write an exported node memory document into ``flow`` (its owner and flow named
    anew) unless the node already has one; whether it wrote."""
    key = node_key(flow=flow, session_id=doc["session_id"], node_id=doc["node_id"])
    storage = _storage()
    with transaction.atomic():
        _lock(key.path)
        if _load(storage, key) is not None:
            return False
        _write(storage, key, {**doc, "owner_id": flow.owner_id, "flow_id": str(flow.pk)})
    return True
