"""Node memory: a per-(flow, conversation, node) history kept as a JSON document.

Storage: ``node_memory/{flow_id}/{conversation}/{node_id}.json`` through the Django
storage ``settings.NODE_MEMORY_STORAGE`` (local files by default, any object store
through its storage backend); no table holds the messages. ``{conversation}`` is the
session id itself when it is made of letters, digits and ``. _ -`` only (at most 200
characters), else ``~`` + its SHA-256, so no session id can name another's path.
A document larger than ``NODE_MEMORY_GZIP_BYTES`` (when > 0) is stored gzipped as
``.json.gz``; reads take whichever exists (the higher ``revision`` if both do, after
a crash between writing one and deleting the other).

Document: ``{"version": 1, "revision", "owner_id", "flow_id", "session_id",
"node_id", "created_at", "updated_at", "messages": [...]}``; each message has
``message_id``, ``parent_message_id``, ``role``, ``content``, ``files``,
``token_count`` (tokens of the content) and ``created_at``.

Turns: a turn is the seed's ``add_messages`` call, one user and one assistant
message stored under the same ``message_id`` (the caller's message id, e.g. of the
Message table) and the same ``parent_message_id`` (the turn it follows). A null
parent starts a thread (the first turn, or a regeneration of it); an omitted parent
(``LATEST``) is resolved when writing to the newest turn, so callers that do not
track parents get a linear history. A parent must already be in the document and
a message id may not be reused, so the turns always form a forest: no cycles.

Concurrency: every write is a read-modify-write under a Postgres advisory lock
keyed by the document path (``pg_advisory_xact_lock``), so two executions of the
same node never lose a turn. Local files are replaced atomically (temp file +
rename), so readers need no lock; with other storages readers take the lock shared.
Each process keeps the last parsed documents (up to ``CACHE_MAX_BYTES`` of JSON),
checked against the bytes read on every access, so a read skips the parse when the
document has not changed, whoever wrote it.
"""

from __future__ import annotations

import enum
import gzip
import hashlib
import json
import logging
import os
import re
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from operator import itemgetter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.db import transaction
from django.utils import timezone

from core.db import advisory_xact_lock
from core.providers.tokens import count_tokens
from core.validation import validate_node_id, validate_session_id
from ingestion.conversation import (
    History,
    HistoryError,
    HistoryItem,
    TokenBufferMemory,
    UnknownMessage,
    extract_thread,
    history_from_items,
    validate_budget,
)
from ingestion.models import Flow

logger = logging.getLogger(__name__)

ROOT = "node_memory"
VERSION = 1
MESSAGE_ID_MAX = 200
_PLAIN_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_MESSAGE_ID = itemgetter("message_id")
_PARENT_ID = itemgetter("parent_message_id")


class Parent(enum.Enum):
    """``parent_message_id=LATEST``: follow the newest turn of the document."""

    LATEST = "latest"


LATEST = Parent.LATEST


# --- errors -------------------------------------------------------------------------
class NodeMemoryNotFound(HistoryError):
    status_code = 404
    code = "not_found"


class DuplicateMessage(HistoryError):
    status_code = 409
    code = "duplicate_message"


class UnknownParent(HistoryError):
    status_code = 422
    code = "unknown_parent"


class MemoryConfigurationError(HistoryError):
    code = "configuration_error"


# --- values -------------------------------------------------------------------------
@dataclass(frozen=True)
class TurnIn:
    message_id: str
    parent_message_id: str | None | Parent
    user_content: str
    assistant_content: str
    user_files: list[dict[str, Any]] = field(default_factory=list)
    assistant_files: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class NodeTurn:
    message_id: str
    parent_message_id: str | None
    items: list[HistoryItem]
    created: bool


@dataclass(frozen=True)
class NodeKey:
    owner_id: int
    flow_id: uuid.UUID
    session_id: str
    node_id: str

    @property
    def path(self) -> str:
        return f"{ROOT}/{self.flow_id}/{session_segment(self.session_id)}/{self.node_id}.json"


def session_segment(session_id: str) -> str:
    if _PLAIN_SEGMENT_RE.match(session_id):
        return session_id
    return "~" + hashlib.sha256(session_id.encode()).hexdigest()


def node_key(*, flow: Flow, session_id: str, node_id: str) -> NodeKey:
    validate_session_id(session_id)
    validate_node_id(node_id)
    return NodeKey(owner_id=flow.owner_id, flow_id=flow.pk, session_id=session_id, node_id=node_id)


def _turn_in(
    *,
    message_id: Any,
    parent_message_id: Any,
    user_content: Any,
    assistant_content: Any,
    user_files: Any,
    assistant_files: Any,
) -> TurnIn:
    def ident(name: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip() or len(value) > MESSAGE_ID_MAX:
            raise HistoryError(f"{name} must be a non-blank string of at most {MESSAGE_ID_MAX}")
        return value

    def files(name: str, value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, list | tuple) or not all(isinstance(f, dict) for f in value):
            raise HistoryError(f"{name} must be a list of file references")
        return [dict(f) for f in value]

    for name, text in (("user_content", user_content), ("assistant_content", assistant_content)):
        if not isinstance(text, str):
            raise HistoryError(f"{name} must be a string")
    parent = parent_message_id
    if not isinstance(parent, Parent) and parent is not None:
        parent = ident("parent_message_id", parent)
    return TurnIn(
        message_id=ident("message_id", message_id), parent_message_id=parent,
        user_content=user_content, assistant_content=assistant_content,
        user_files=files("user_files", user_files),
        assistant_files=files("assistant_files", assistant_files),
    )  # fmt: skip


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
        "version": VERSION, "revision": 0, "owner_id": key.owner_id,
        "flow_id": str(key.flow_id), "session_id": key.session_id, "node_id": key.node_id,
        "created_at": now, "updated_at": now, "messages": [],
    }  # fmt: skip


# --- turns --------------------------------------------------------------------------
def _entry(
    turn: TurnIn, parent: str | None, role: str, content: str, files: list[dict[str, Any]], now: str
) -> dict[str, Any]:
    return {
        "message_id": turn.message_id, "parent_message_id": parent, "role": role,
        "content": content, "files": files, "token_count": count_tokens(content),
        "created_at": now,
    }  # fmt: skip


def _entry_item(entry: dict[str, Any]) -> HistoryItem:
    return HistoryItem(
        message_id=entry["message_id"], parent_message_id=entry["parent_message_id"],
        role=entry["role"], content=entry["content"],
        files=[dict(f) for f in entry["files"]],  # callers must not edit the cached document
        token_count=entry["token_count"], created_at=entry["created_at"],
    )  # fmt: skip


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
        message_id=message_id, parent_message_id=parent_message_id,
        user_content=user_content, assistant_content=assistant_content,
        user_files=list(user_files), assistant_files=list(assistant_files),
    )  # fmt: skip
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
    counted as in ``ingestion.conversation``), the newest message is always kept.
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


# --- in-process memory objects ------------------------------------------------------
class NodeTokenBufferMemory:
    """The seed's NodeTokenBufferMemory: buffered turns, persisted by ``flush()``.

    ``get_history`` sees the stored turns and the buffered ones; a node that has no
    document yet has an empty history.
    """

    def __init__(self, *, flow: Flow, conversation_id: str, node_id: str):
        self.flow = flow
        self.key = node_key(flow=flow, session_id=conversation_id, node_id=node_id)
        self._pending: list[TurnIn] = []

    def add_messages(
        self,
        *,
        message_id: str,
        parent_message_id: str | None | Parent = LATEST,
        user_content: str,
        assistant_content: str,
        user_files: Sequence[dict[str, Any]] = (),
        assistant_files: Sequence[dict[str, Any]] = (),
    ) -> None:
        self._pending.append(
            _turn_in(
                message_id=message_id, parent_message_id=parent_message_id,
                user_content=user_content, assistant_content=assistant_content,
                user_files=list(user_files), assistant_files=list(assistant_files),
            )
        )  # fmt: skip

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> list[NodeTurn]:
        """Persist the buffered turns in one locked write, all or none."""
        if not self._pending:
            return []
        results = node_memory_append_turns(
            flow=self.flow, session_id=self.key.session_id, node_id=self.key.node_id,
            turns=self._pending,
        )  # fmt: skip
        self._pending = []
        return results

    def get_history(
        self, *, current_message_id: str | None = None, max_token_limit: int | None = None
    ) -> History:
        max_tokens = settings.HISTORY_MAX_TOKENS if max_token_limit is None else max_token_limit
        validate_budget(max_tokens=max_tokens)
        doc = _mutable(_read(self.key) or _new_doc(self.key, ""))
        if self._pending:
            _apply_turns(doc, self._pending, _now_iso(timezone.now()))
        if not doc["messages"] and current_message_id is None:
            return History(items=[], token_count=0, max_tokens=max_tokens, thread_length=0)
        return _history(doc["messages"], current_message_id, max_tokens)

    def get_history_prompt_messages(self, **kwargs: Any) -> list[dict[str, str]]:
        return self.get_history(**kwargs).as_messages()

    def clear(self) -> None:
        self._pending = []
        try:
            node_memory_clear(
                flow=self.flow, session_id=self.key.session_id, node_id=self.key.node_id
            )
        except NodeMemoryNotFound:
            pass


class MemoryMode(StrEnum):
    CONVERSATION = "conversation"
    NODE = "node"


@dataclass(frozen=True)
class MemoryConfig:
    """How an LLM node remembers: the whole conversation, or its own turns."""

    mode: MemoryMode = MemoryMode.CONVERSATION
    message_limit: int | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", MemoryMode(self.mode))
        except ValueError:
            raise MemoryConfigurationError(
                f"memory mode must be 'conversation' or 'node', not {self.mode!r}"
            ) from None


def memory_for(
    config: MemoryConfig, *, flow: Flow, conversation_id: str | None, node_id: str | None = None
) -> TokenBufferMemory | NodeTokenBufferMemory:
    """The memory object for a node execution, or ``MemoryConfigurationError``.

    Never falls back silently: node memory without a conversation (e.g. a workflow
    run outside a chat) or without a node id is an error, as is conversation memory
    without a conversation.
    """
    if config.mode is MemoryMode.NODE:
        if not conversation_id:
            raise MemoryConfigurationError(
                "node memory needs a conversation id: mode 'node' keeps one history per "
                "(flow, conversation, node), and this execution has no conversation. Run "
                "the node in a conversation, or configure mode 'conversation' or no memory."
            )
        if not node_id:
            raise MemoryConfigurationError("node memory needs a node id")
        return NodeTokenBufferMemory(flow=flow, conversation_id=conversation_id, node_id=node_id)
    if not conversation_id:
        raise MemoryConfigurationError(
            "conversation memory needs a conversation id; configure no memory for runs "
            "outside a conversation"
        )
    return TokenBufferMemory(
        flow=flow, conversation_id=conversation_id, message_limit=config.message_limit
    )
