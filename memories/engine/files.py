"""The engine's Markdown files, in the Django storage named by ``ENGINE_STORAGE``.

Layout, per owner and scope (each scope segment percent-encoded, dots included, so a
segment such as ``..`` or ``a/b`` stays one directory name; one whose encoding is longer
than a file name may be is shortened with a hash, ``scope_dir``)::

    journal/<owner id>/<scope>/YYYY-MM-DD.md   the daily journal (one entry per flush)
    memory/<owner id>/<scope>/MEMORY.md        the core facts rendered as Markdown
    dreams/<owner id>/<scope>/YYYY-MM-DD.md    the dream diary

The owner id comes first so two tenants' ``["user", "alice"]`` never share a file.
Writers of one scope hold the scope's run lock (``memories.engine.locks``), so a
read-modify-write of a day file never races another.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.files.storage import Storage, storages

from core.errors import InvalidInput, NotFound
from memories.conversations.node_memory.documents import _put

ENTRY_MARK = re.compile(r"<!-- entry ([0-9a-f]{64}) -->")


class JournalNotFound(NotFound):
    code = "journal_not_found"


def storage() -> Storage:
    return storages[settings.ENGINE_STORAGE]


# A file system takes names of up to 255 bytes; a segment's encoding may take 765 (255
# dots). One that is longer is its first 200 bytes, "~" and 40 hex digits of its SHA-256:
# "~" is no character of a segment, so no segment's own encoding is ever one of these,
# and a name that fits keeps the encoding it always had.
NAME_MAX = 255


def scope_dir(owner_id: int, scope: list[str] | tuple[str, ...]) -> str:
    return "/".join([str(owner_id), *(_dir_name(segment) for segment in scope)])


def _dir_name(segment: str) -> str:
    name = quote(segment, safe="@:+=-_").replace(".", "%2E")
    if len(name) <= NAME_MAX:
        return name
    return f"{name[:200]}~{hashlib.sha256(segment.encode()).hexdigest()[:40]}"


def journal_path(owner_id: int, scope: list[str] | tuple[str, ...], day: date) -> str:
    return f"journal/{scope_dir(owner_id, scope)}/{day.isoformat()}.md"


def memory_md_path(owner_id: int, scope: list[str] | tuple[str, ...]) -> str:
    return f"memory/{scope_dir(owner_id, scope)}/MEMORY.md"


def diary_path(owner_id: int, scope: list[str] | tuple[str, ...], day: date) -> str:
    return f"dreams/{scope_dir(owner_id, scope)}/{day.isoformat()}.md"


def read_text(name: str) -> str | None:
    try:
        with storage().open(name, "rb") as fh:
            return fh.read().decode()
    except FileNotFoundError:
        return None


def write_text(name: str, text: str) -> None:
    """Replace the file (atomically on local storage: a temp file renamed over it)."""
    _put(storage(), name, text.encode())


def parse_day(value: Any) -> date:
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise InvalidInput(
            "date must be a day as YYYY-MM-DD", details={"date": f"{value!r} is not a day"}
        ) from None


# --- the journal ------------------------------------------------------------------
def entry_hash(messages: list[dict[str, Any]]) -> str:
    """What makes two entries the same: their messages (role and content)."""
    canonical = [{"role": m.get("role"), "content": m.get("content")} for m in messages]
    return hashlib.sha256(json.dumps(canonical, ensure_ascii=False).encode()).hexdigest()


def render_entry(messages: list[dict[str, Any]], at: datetime, source: str) -> str:
    lines = [
        f"## {_utc(at).strftime('%H:%M:%S')} UTC · {source}",
        f"<!-- entry {entry_hash(messages)} -->",
        "",
    ]
    for message in messages:
        text = str(message.get("content", "")).strip().replace("\n", "\n  ")
        lines.append(f"- **{message.get('role', 'user')}**: {text}")
    return "\n".join(lines) + "\n\n"


def journal_append(
    *, owner_id: int, scope: list[str], messages: list[dict[str, Any]], at: datetime, source: str
) -> bool:
    """Append one dated entry to the scope's journal of ``at``'s day (UTC); an entry
    with the same messages already in that day's file is not appended again
    (a re-run after a crash, a client retrying its flush). Whether it appended."""
    day = _utc(at).date()
    name = journal_path(owner_id, scope, day)
    current = read_text(name)
    if current is not None and entry_hash(messages) in ENTRY_MARK.findall(current):
        return False
    header = f"# Journal · {'/'.join(scope)} · {day.isoformat()}\n\n"
    write_text(name, (current or header) + render_entry(messages, at, source))
    return True


def _utc(at: datetime) -> datetime:
    """``at`` in UTC, the journal's days and clock (a message's ``at`` keeps the offset
    it was given: 01:00+05:00 was journaled as 01:00 UTC of its local day); naive is UTC."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def journal_read(*, owner_id: int, scope: list[str], day: date) -> str:
    text = read_text(journal_path(owner_id, scope, day))
    if text is None:
        raise JournalNotFound(f"no journal for {day.isoformat()} in this scope")
    return text


def journal_days(*, owner_id: int, scope: list[str]) -> list[date]:
    """The days the scope has a journal for, newest first."""
    folder = f"journal/{scope_dir(owner_id, scope)}"
    try:
        _, files = storage().listdir(folder)
    except FileNotFoundError:
        return []
    days = []
    for name in files:
        try:
            days.append(date.fromisoformat(name.removesuffix(".md")))
        except ValueError:
            continue
    return sorted(days, reverse=True)
