"""The engine's files family: each scope's journal days, its ``MEMORY.md`` and its dream
diary days (``memories.engine.files``), as text.

Lines: ``journal`` and ``diary`` (``scope``, ``day``, ``text``) and ``memory_md``
(``scope``, ``text``). A file the target scope already has is kept as it is: an import
adds the days it lacks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from ingestion.portability.common import bad, text
from ingestion.portability.facts import Facts
from memories.engine import files
from memories.facts.models import Scope

KINDS = {"journal": files.journal_path, "diary": files.diary_path}


def _days(folder: str) -> list[date]:
    try:
        _, names = files.storage().listdir(folder)
    except FileNotFoundError:
        return []
    days = []
    for name in names:
        try:
            days.append(date.fromisoformat(name.removesuffix(".md")))
        except ValueError:
            continue
    return sorted(days)


def export(owner_id: int) -> Iterator[dict[str, Any]]:
    for scope in Scope.objects.filter(owner_id=owner_id).order_by("path"):
        path = list(scope.path)
        where = files.scope_dir(owner_id, path)
        for kind, folder in (("journal", "journal"), ("diary", "dreams")):
            for day in _days(f"{folder}/{where}"):
                body = files.read_text(KINDS[kind](owner_id, path, day))
                if body is not None:
                    yield {"type": kind, "scope": path, "day": day.isoformat(), "text": body}
        body = files.read_text(files.memory_md_path(owner_id, path))
        if body is not None:
            yield {"type": "memory_md", "scope": path, "text": body}


@dataclass
class Journals:
    rows: list[dict[str, Any]] = field(default_factory=list)
    types = ("journal", "diary", "memory_md")

    def parse(self, obj: dict[str, Any], line: int, facts: Facts) -> None:
        row = {"line": line, "kind": obj["type"], "scope": facts.path(obj.get("scope"), line),
               "text": text(obj, "text", line, blank=False), "day": None}  # fmt: skip
        if obj["type"] != "memory_md":
            try:
                row["day"] = date.fromisoformat(str(obj.get("day")))
            except ValueError:
                raise bad(line, "day is not a date (YYYY-MM-DD)") from None
        self.rows.append(row)

    def write(self, owner_id: int) -> int:
        """The files the scopes lack (after the commit: files are not transactional)."""
        written = 0
        for row in self.rows:
            scope = list(row["scope"])
            name = (files.memory_md_path(owner_id, scope) if row["kind"] == "memory_md"
                    else KINDS[row["kind"]](owner_id, scope, row["day"]))  # fmt: skip
            if files.read_text(name) is None:
                files.write_text(name, row["text"])
                written += 1
        return written
