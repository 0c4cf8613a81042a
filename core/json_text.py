"""A JSON document edited in place: each change splices the text, so every byte it does
not touch stays as it came (key order, spacing, escapes, raw UTF-8). The chat proxy
relays bodies this way, byte for byte apart from what it adds.

Values are located with the standard decoder (``raw_decode`` from a position), so the
text must be valid JSON; a duplicated key resolves to its last occurrence, as
``json.loads`` does. What an edit adds is written compactly, non-ASCII as UTF-8.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_decoder = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_UNSET: Any = object()

Path = Sequence[str | int]


def dump(value: Any) -> str:
    """How an edit writes a value: compact, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class _Entry:
    """A member of an object (``key``) or an item of an array (``key`` None): where it
    starts (its key, for a member) and where its value starts and ends."""

    key: str | None
    start: int
    value_start: int
    value_end: int


class JsonText:
    def __init__(self, text: str) -> None:
        self.text = text
        self._data: Any = _UNSET

    @classmethod
    def parse(cls, raw: bytes | str) -> JsonText:
        """The document ``raw`` holds (UTF-8); ``ValueError`` when it is not JSON."""
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        parsed = cls(text)
        parsed._data = json.loads(text)
        return parsed

    @classmethod
    def of(cls, value: Any) -> JsonText:
        return cls(dump(value))

    @property
    def data(self) -> Any:
        """The parsed value (read it, do not change it: edits go through the methods)."""
        if self._data is _UNSET:
            self._data = json.loads(self.text)
        return self._data

    def encode(self) -> bytes:
        return self.text.encode("utf-8")

    # --- edits: each answers a new document -----------------------------------------
    def set(self, path: Path, value: Any) -> JsonText:
        """``value`` at ``path``: replaced where it is, or added as the last member of
        the object that ``path[:-1]`` names."""
        *parent, last = path
        start, _ = self._span(parent)
        entries = self._entries(start)
        if isinstance(last, int):
            if self.text[start] != "[" or not -len(entries) <= last < len(entries):
                raise KeyError(f"no item {last} at {list(parent)}")
            return self._splice(entries[last].value_start, entries[last].value_end, dump(value))
        if self.text[start] != "{":
            raise KeyError(f"{list(parent)} is not an object")
        found = [e for e in entries if e.key == last]
        if found:
            return self._splice(found[-1].value_start, found[-1].value_end, dump(value))
        member = f"{dump(last)}:{dump(value)}"
        if entries:
            return self._splice(entries[-1].value_end, entries[-1].value_end, "," + member)
        return self._splice(start + 1, start + 1, member)

    def remove(self, path: Path) -> JsonText:
        """Without the member (every occurrence of the key) or the item at ``path``;
        unchanged when there is none."""
        *parent, last = path
        edited = self
        while True:
            start, _ = edited._span(parent)
            entries = edited._entries(start)
            if isinstance(last, str):
                at = [i for i, e in enumerate(entries) if e.key == last]
            else:  # an item: once (the next one takes its place)
                if not -len(entries) <= last < len(entries):
                    return edited
                return edited._without(entries, last % len(entries))
            if not at:
                return edited
            edited = edited._without(entries, at[-1])

    def insert(self, path: Path, index: int, *values: Any) -> JsonText:
        """``values`` into the array at ``path``, before its item ``index`` (its length:
        after the last)."""
        if not values:
            return self
        start, _ = self._span(path)
        if self.text[start] != "[":
            raise KeyError(f"{list(path)} is not an array")
        items = self._entries(start)
        added = ",".join(dump(v) for v in values)
        if not items:
            return self._splice(start + 1, start + 1, added)
        if index >= len(items):
            return self._splice(items[-1].value_end, items[-1].value_end, "," + added)
        at = items[index].value_start
        return self._splice(at, at, added + ",")

    def append(self, path: Path, *values: Any) -> JsonText:
        return self.insert(path, 1 << 62, *values)

    def extend_string(self, path: Path, suffix: str) -> JsonText:
        """The string at ``path`` with ``suffix`` added at its end (inside its quotes:
        the escapes already there stay as they were)."""
        start, end = self._span(path)
        if self.text[start] != '"':
            raise KeyError(f"{list(path)} is not a string")
        return self._splice(end - 1, end - 1, dump(suffix)[1:-1])

    # --- reading the text -------------------------------------------------------------
    def _span(self, path: Path) -> tuple[int, int]:
        start = _SPACE.match(self.text, 0).end()  # type: ignore[union-attr]
        _, end = _decoder.raw_decode(self.text, start)
        for step in path:
            entries = self._entries(start)
            if isinstance(step, str):
                found = [e for e in entries if e.key == step]
                if not found or self.text[start] != "{":
                    raise KeyError(f"no member {step!r}")
                entry = found[-1]
            else:
                if self.text[start] != "[" or not -len(entries) <= step < len(entries):
                    raise KeyError(f"no item {step}")
                entry = entries[step]
            start, end = entry.value_start, entry.value_end
        return start, end

    def _entries(self, start: int) -> list[_Entry]:
        """The members of the object, or the items of the array, opening at ``start``;
        [] for any other value."""
        text = self.text
        opening = text[start]
        if opening not in "{[":
            return []
        closing = "}" if opening == "{" else "]"
        entries: list[_Entry] = []
        at = self._skip(start + 1)
        if text[at] == closing:
            return entries
        while True:
            key, value_start = None, at
            if opening == "{":
                key, after_key = _decoder.raw_decode(text, at)
                value_start = self._skip(self._skip(after_key) + 1)  # past the colon
            _, value_end = _decoder.raw_decode(text, value_start)
            entries.append(_Entry(key, at, value_start, value_end))
            at = self._skip(value_end)
            if text[at] == closing:
                return entries
            at = self._skip(at + 1)  # past the comma

    def _skip(self, at: int) -> int:
        return _SPACE.match(self.text, at).end()  # type: ignore[union-attr]

    def _without(self, entries: list[_Entry], index: int) -> JsonText:
        entry = entries[index]
        if index + 1 < len(entries):  # up to the next one, its comma included
            return self._splice(entry.start, entries[index + 1].start, "")
        if index > 0:  # the last: from the end of the one before, its comma included
            return self._splice(entries[index - 1].value_end, entry.value_end, "")
        return self._splice(entry.start, entry.value_end, "")

    def _splice(self, start: int, end: int, text: str) -> JsonText:
        return JsonText(self.text[:start] + text + self.text[end:])
