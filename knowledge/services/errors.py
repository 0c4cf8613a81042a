"""Errors and values of the knowledge services."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from core.errors import Conflict, InvalidInput, ServiceError
from core.times import RANGE, storable

MESSAGE_CHUNKING = (1000, 100)
FILE_CHUNKING = (500, 50)
# Fields of a document stored in their own (indexed, filterable) chunk columns; the
# documents API accepts them as metadata keys (``DocumentIn.from_payload``).
COLUMN_KEYS = (
    "message_id",
    "session_id",
    "flow_id",
    "run_id",
    "sender",
    "source_type",
    "file_path",
    "content_hash",
)


class KnowledgeError(InvalidInput):
    pass


class ReadOnlyKnowledgeBase(Conflict):
    code = "read_only"


class IngestCancelled(ServiceError):
    status_code = 409
    code = "cancelled"


def parse_timestamp(value: Any) -> datetime | None:
    """An ISO 8601 date-time (or date); one without an offset is UTC, as the search's
    ``since`` and ``until`` take it."""
    if value is None or value == "":
        return None
    try:  # (the shape of one, but no time: 2026-13-01, an offset of +25:00)
        parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    except ValueError:
        parsed = None
    if parsed is None:
        raise KnowledgeError(f"metadata timestamp {value!r} is not an ISO 8601 date-time",
                             details={"timestamp": "not an ISO 8601 date-time"})  # fmt: skip
    parsed = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    if not storable(parsed):
        raise KnowledgeError(f"metadata timestamp {value!r} is not {RANGE}",
                             details={"timestamp": f"not {RANGE}"})  # fmt: skip
    return parsed


@dataclass(frozen=True)
class DocumentIn:
    """One document to ingest. Its source (message, session, flow, run, sender, source
    type, file, content hash, timestamp) are typed fields stored in their own chunk
    columns; ``metadata`` is anything else, kept as JSON. ``timestamp`` None means the
    ingestion time."""

    text: str
    source_key: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    message_id: str = ""
    session_id: str = ""
    flow_id: str = ""
    run_id: str = ""
    sender: str = ""
    source_type: str = ""
    file_path: str = ""
    content_hash: str = ""
    timestamp: datetime | None = None

    def __post_init__(self) -> None:
        misplaced = sorted(set(self.metadata) & {*COLUMN_KEYS, "timestamp"})
        if misplaced:  # a caller still speaking the untyped contract
            raise TypeError(f"pass {', '.join(misplaced)} as DocumentIn fields, not metadata")

    @classmethod
    def from_payload(
        cls, *, text: str, source_key: str, metadata: Mapping[str, Any] | None = None
    ) -> DocumentIn:
        """The documents API's shape: the column keys (and ``timestamp``, ISO 8601) may
        come inside ``metadata``; they become fields. Raises ``KnowledgeError`` on a
        bad timestamp."""
        meta = dict(metadata or {})
        columns = {key: str(meta.pop(key, "") or "") for key in COLUMN_KEYS}
        timestamp = parse_timestamp(meta.pop("timestamp", None))
        return cls(text=text, source_key=source_key, metadata=meta, timestamp=timestamp, **columns)

    def payload(self) -> dict[str, Any]:
        """The inverse of ``from_payload`` (JSON-safe), as background jobs store it."""
        meta = dict(self.metadata)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in COLUMN_KEYS and value:
                meta[f.name] = value
        if self.timestamp is not None:
            meta["timestamp"] = self.timestamp.isoformat()
        return {"text": self.text, "source_key": self.source_key, "metadata": meta}


@dataclass(frozen=True)
class IngestResult:
    documents: int
    chunks_written: int
    chunks_deleted: int


@dataclass(frozen=True)
class IndexRun:
    indexed: int
    finished: bool  # no pending rows were left
    busy: bool  # another indexer held the lock, or another transaction the rows
