"""Node memory documents: storage, locking, the per-process parse cache, and the
turn forest inside a document."""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.db import transaction

from core.db import advisory_xact_lock
from core.providers.tokens import count_tokens
from memories.conversations.history import (
    History,
    HistoryError,
    HistoryItem,
    UnknownMessage,
    extract_thread,
    history_from_items,
)
from memories.conversations.node_memory.values import (
    _MESSAGE_ID,
    _PARENT_ID,
    LATEST,
    VERSION,
    DuplicateMessage,
    NodeKey,
    NodeTurn,
    TurnIn,
    UnknownParent,
)

logger = logging.getLogger(__name__)


# --- storage and locking ------------------------------------------------------------
def _storage() -> Storage:
    return storages[settings.NODE_MEMORY_STORAGE]


def _lock(path: str, *, shared: bool = False) -> None:
    """Hold the document's advisory lock until the surrounding transaction ends."""
    advisory_xact_lock(f"node-memory:{path}", shared=shared)


def _read_raw(storage: Storage, name: str) -> dict[str, Any] | None:
    try:
        with storage.open(name, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    return _parse(name, raw)


# Parsed documents, keyed by name and validated by the stored bytes' length and
# CRC-32: a hit is the same content, whoever wrote it, so it is never stale. Parsing
# is most of a read (~30 ms for a 10,000-message document); the bytes are still read
# every time. Cached documents are shared: read them, or copy with ``_mutable``.
CACHE_MAX_BYTES = 16 * 1024 * 1024  # of JSON text, per process
_cache: OrderedDict[str, tuple[tuple[int, int], int, dict[str, Any]]] = OrderedDict()
_cache_lock = threading.Lock()


def _fingerprint(raw: bytes) -> tuple[int, int]:
    return len(raw), zlib.crc32(raw)


def _parse(name: str, raw: bytes) -> dict[str, Any]:
    fingerprint = _fingerprint(raw)
    with _cache_lock:
        hit = _cache.get(name)
        if hit is not None and hit[0] == fingerprint:
            _cache.move_to_end(name)
            return hit[2]
    data = gzip.decompress(raw) if name.endswith(".gz") else raw
    doc = json.loads(data)
    _remember(name, fingerprint, len(data), doc)
    return doc


def _remember(name: str, fingerprint: tuple[int, int], size: int, doc: dict[str, Any]) -> None:
    with _cache_lock:
        _cache.pop(name, None)
        if size > CACHE_MAX_BYTES:
            return
        _cache[name] = (fingerprint, size, doc)
        while sum(entry[1] for entry in _cache.values()) > CACHE_MAX_BYTES:
            _cache.popitem(last=False)


def _forget(name: str) -> None:
    with _cache_lock:
        _cache.pop(name, None)


def _mutable(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy that may be appended to: turns only ever add message dicts."""
    return {**doc, "messages": list(doc["messages"])}


def _load(storage: Storage, key: NodeKey) -> dict[str, Any] | None:
    docs = [
        doc
        for name in (key.path, key.path + ".gz")
        if storage.exists(name) and (doc := _read_raw(storage, name)) is not None
    ]
    if not docs:
        return None
    doc = max(docs, key=lambda d: d.get("revision", 0))
    if doc.get("version") != VERSION:
        raise HistoryError(f"node memory document {key.path} has unsupported version")
    if doc.get("owner_id") != key.owner_id:
        logger.warning("node memory %s belongs to another owner", key.path)
        return None
    return doc


def _write(storage: Storage, key: NodeKey, doc: dict[str, Any]) -> None:
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    size = len(data)
    threshold = settings.NODE_MEMORY_GZIP_BYTES
    target, other = key.path, key.path + ".gz"
    if threshold and size > threshold:
        target, other = other, target
        # Level 1: ~5x smaller than the JSON in a tenth of level 6's time (under the lock).
        data = gzip.compress(data, compresslevel=1, mtime=0)
    _put(storage, target, data)
    _remember(target, _fingerprint(data), size, doc)
    # Written first, deleted second: a crash in between leaves both, and reads
    # take the higher revision.
    _forget(other)
    if storage.exists(other):
        storage.delete(other)


def _put(storage: Storage, name: str, data: bytes) -> None:
    if isinstance(storage, FileSystemStorage):
        _put_local(storage, Path(storage.path(name)), data)
        return
    if storage.exists(name) and storage.get_available_name(name) != name:
        storage.delete(name)  # this storage would not overwrite; readers hold the lock
    saved = storage.save(name, ContentFile(data))
    if saved != name:
        raise RuntimeError(f"storage saved node memory as {saved!r} instead of {name!r}")


def _put_local(storage: FileSystemStorage, path: Path, data: bytes) -> None:
    """Write a temp file beside the target and rename it over: readers see the old or
    the new document, never a partial one, and a crash leaves the old one."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    for attempt in range(3):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileNotFoundError:  # the idle cleanup removed the empty directory
            if attempt == 2:
                raise
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    if storage.file_permissions_mode is not None:
        os.chmod(tmp, storage.file_permissions_mode)
    os.replace(tmp, path)


def _readers_lock(storage: Storage) -> bool:
    return not isinstance(storage, FileSystemStorage)


def _read(key: NodeKey) -> dict[str, Any] | None:
    storage = _storage()
    if not _readers_lock(storage):
        return _load(storage, key)
    with transaction.atomic():
        _lock(key.path, shared=True)
        return _load(storage, key)


def _now_iso(now: datetime) -> str:
    return now.isoformat().replace("+00:00", "Z")


def _new_doc(key: NodeKey, now: str) -> dict[str, Any]:
    return {
        "version": VERSION,
        "revision": 0,
        "owner_id": key.owner_id,
        "flow_id": str(key.flow_id),
        "session_id": key.session_id,
        "node_id": key.node_id,
        "created_at": now,
        "updated_at": now,
        "messages": [],
    }


# --- turns --------------------------------------------------------------------------
def _entry(
    turn: TurnIn, parent: str | None, role: str, content: str, files: list[dict[str, Any]], now: str
) -> dict[str, Any]:
    return {
        "message_id": turn.message_id,
        "parent_message_id": parent,
        "role": role,
        "content": content,
        "files": files,
        "token_count": count_tokens(content),
        "created_at": now,
    }


def _entry_item(entry: dict[str, Any]) -> HistoryItem:
    return HistoryItem(
        message_id=entry["message_id"],
        parent_message_id=entry["parent_message_id"],
        role=entry["role"],
        content=entry["content"],
        files=[dict(f) for f in entry["files"]],  # callers must not edit the cached document
        token_count=entry["token_count"],
        created_at=entry["created_at"],
    )


def _node_turn(entries: list[dict[str, Any]], created: bool) -> NodeTurn:
    return NodeTurn(
        message_id=entries[0]["message_id"],
        parent_message_id=entries[0]["parent_message_id"],
        items=[_entry_item(e) for e in entries],
        created=created,
    )


def _is_replay(entries: list[dict[str, Any]], turn: TurnIn) -> bool:
    sent = [(turn.user_content, turn.user_files), (turn.assistant_content, turn.assistant_files)]
    stored = [(e["content"], e["files"]) for e in entries]
    parent_ok = turn.parent_message_id is LATEST or (
        turn.parent_message_id == entries[0]["parent_message_id"]
    )
    return parent_ok and sent == stored


def _apply_turns(doc: dict[str, Any], turns: Sequence[TurnIn], now: str) -> list[NodeTurn]:
    """Append ``turns`` to ``doc`` in memory, all or none (raises before any change
    is visible outside ``doc``, which the caller then discards)."""
    messages: list[dict[str, Any]] = doc["messages"]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for entry in messages:
        by_id.setdefault(entry["message_id"], []).append(entry)
    results = []
    for turn in turns:
        existing = by_id.get(turn.message_id)
        if existing is not None:
            if not _is_replay(existing, turn):
                raise DuplicateMessage(
                    f"message {turn.message_id!r} is already in this node memory, with other "
                    "content or parent",
                    details={"message_id": turn.message_id},
                )
            results.append(_node_turn(existing, created=False))
            continue
        parent = _resolve_parent(turn, messages, by_id)
        entries = [
            _entry(turn, parent, "user", turn.user_content, turn.user_files, now),
            _entry(turn, parent, "assistant", turn.assistant_content, turn.assistant_files, now),
        ]
        messages.extend(entries)
        by_id[turn.message_id] = entries
        results.append(_node_turn(entries, created=True))
    return results


def _resolve_parent(
    turn: TurnIn, messages: list[dict[str, Any]], by_id: dict[str, list[dict[str, Any]]]
) -> str | None:
    parent = turn.parent_message_id
    if parent is LATEST:
        return messages[-1]["message_id"] if messages else None
    if parent is None:
        return None
    assert isinstance(parent, str)
    if parent == turn.message_id:
        raise UnknownParent(
            f"message {turn.message_id!r} cannot be its own parent (a cycle)",
            details={"parent_message_id": parent},
        )
    if parent not in by_id:
        raise UnknownParent(
            f"parent message {parent!r} is not in this node memory; a turn can only follow "
            "a stored turn, which keeps the thread free of cycles",
            details={"parent_message_id": parent},
        )
    return parent


def _history(
    messages: list[dict[str, Any]], current_message_id: str | None, max_tokens: int
) -> History:
    newest_first: Sequence[dict[str, Any]] = messages[::-1]
    if current_message_id is not None:
        ids = list(map(_MESSAGE_ID, newest_first))
        try:
            newest_first = newest_first[ids.index(current_message_id) :]
        except ValueError:
            raise UnknownMessage(
                f"message {current_message_id!r} is not in this node memory",
                details={"current_message_id": current_message_id},
            ) from None
    thread = extract_thread(newest_first, key=_MESSAGE_ID, parent=_PARENT_ID, null_parent="root")
    return history_from_items(
        map(_entry_item, thread), thread_length=len(thread), max_tokens=max_tokens
    )
