"""Export and import of everything an owner keeps, as versioned JSON Lines
(``FORMAT`` version ``VERSION``; the schema is ``docs/export-format.json``, the tour
``docs/history-and-export.md``).

The first line is the header (``format``, ``version``, ``exported_at``,
``embedding_model``, ``vectors``); then each family's lines, in the order an import
needs them: knowledge bases and chunks (``knowledge``), flows, messages, node memory and
summaries (``conversations``), memory bases (``bases``), memory stores, their items and
attachments (``stores``), scopes, facts and their versions (``facts``), and the engine's
journal, ``MEMORY.md`` and diary files (``journals``). Vectors are optional.

An import reads and checks every line first (a bad one is a 400 ``invalid_import``
naming its line: nothing is written), embeds what has no vector of the target's model
(outside any transaction), then writes everything in one transaction (the files after
it). It is idempotent: the ids it writes are derived from the file's and the importing
owner (``common.Ids``), and rows without ids are matched by what they hold, so the same
file twice writes nothing new; a newer export of the same facts brings their edits and
deletions (``facts``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from core.api.parsers import UnstorableInput, check_parsed, unstorable_message
from core.providers.embeddings import Embedder, EmbeddingConfig, get_embedder
from ingestion.portability import bases, conversations, facts, journals, knowledge, stores
from ingestion.portability.common import FORMAT, VERSION, Ids, bad, dumps
from memories.facts.scopes import owner_pk

EMBED_BATCH = 256
# The type of the line that closes an export (``end_line`` in its header).
END = "end"


def export_lines(*, owner: AbstractBaseUser | int, vectors: bool = True) -> Iterator[str]:
    """Everything the owner keeps (see the module), one JSON document per string (no
    newline), streamed: large tables are read in batches."""
    owner_id = owner_pk(owner)
    yield json.dumps({
        "format": FORMAT, "version": VERSION, "exported_at": timezone.now().isoformat(),
        "embedding_model": EmbeddingConfig.from_settings().model, "vectors": vectors,
        "end_line": True,
    })  # fmt: skip
    count = 1
    for family in (
        knowledge.export(owner_id, vectors), conversations.export(owner_id),
        bases.export(owner_id), stores.export(owner_id, vectors),
        facts.export(owner_id, vectors), journals.export(owner_id),
    ):  # fmt: skip
        for line in family:
            yield dumps(line)
            count += 1
    # Last, the lines before it: a file cut at a line's end is told from a whole one.
    yield dumps({"type": END, "lines": count})


@dataclass
class ImportReport:
    """What an import wrote: new rows and files per kind (a second import of the same
    file writes none), the texts it embedded again, and the lines it read."""

    written: dict[str, int] = field(default_factory=dict)
    embedded: int = 0
    lines: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {**self.written, "embedded": self.embedded, "lines": self.lines}


@dataclass
class _File:
    mapping: dict[facts.Path, facts.Path]
    model: str = ""
    knowledge: knowledge.Knowledge = field(default_factory=knowledge.Knowledge)
    conversations: conversations.Conversations = field(default_factory=conversations.Conversations)
    bases: bases.Bases = field(default_factory=bases.Bases)
    stores: stores.Stores = field(default_factory=stores.Stores)
    facts: facts.Facts | None = None
    journals: journals.Journals = field(default_factory=journals.Journals)

    def read(self, obj: dict[str, Any], line: int) -> None:
        assert self.facts is not None
        kind = obj.get("type")
        if kind in self.knowledge.types:
            self.knowledge.parse(obj, line)
        elif kind in self.conversations.types:
            self.conversations.parse(obj, line)
        elif kind in self.bases.types:
            self.bases.parse(obj, line, self.conversations.flows, self.knowledge.bases)
        elif kind in self.stores.types:
            self.stores.parse(obj, line, self.conversations.flows)
        elif kind in self.facts.types:
            self.facts.parse(obj, line)
        elif kind in self.journals.types:
            self.journals.parse(obj, line, self.facts)
        else:
            raise bad(line, f"unknown type {kind!r}")


def _parse(lines: Iterable[str], scope_map: Mapping[str, str] | None) -> tuple[_File, int]:
    parsed = _File(facts.scope_map(scope_map))
    parsed.facts = facts.Facts(parsed.mapping)
    number = 0
    ends = False  # the header says an end line closes the file
    ended = 0  # the end line's number, once read
    read = 0  # the lines read, blank ones left out (as the end line counts them)
    for number, raw in enumerate(lines, start=1):
        if number == 1:  # (a byte order mark, which editors on Windows write, is no text)
            raw = raw.removeprefix("\ufeff")
        if not raw.strip():
            continue
        read += 1
        if ended:
            raise bad(number, f"a line after the end line (line {ended})")
        try:
            obj = json.loads(raw)
        except ValueError:
            raise bad(number, "not a JSON object (a truncated line?)") from None
        if not isinstance(obj, dict):
            raise bad(number, "not a JSON object")
        try:  # (what the database cannot store: NUL, a lone surrogate, NaN, too deep)
            check_parsed(obj)
        except UnstorableInput as exc:
            raise bad(number, unstorable_message(exc)) from None
        if number == 1:
            if obj.get("format") != FORMAT or obj.get("version") != VERSION:
                raise bad(1, f"not a {FORMAT} file of version {VERSION}: "
                             f"{obj.get('format')!r} version {obj.get('version')!r}")  # fmt: skip
            parsed.model = str(obj.get("embedding_model") or "")
            ends = obj.get("end_line") is True
            continue
        if obj.get("type") == END:
            if extra := sorted(set(obj) - {"type", "lines"}):  # (the schema allows none)
                raise bad(number, f"the end line has keys other than type and lines: "
                                  f"{', '.join(extra)}")  # fmt: skip
            if obj.get("lines") != read - 1:
                raise bad(number, f"the end line counts {obj.get('lines')!r} lines before "
                                  f"it, the file has {read - 1}")  # fmt: skip
            ended = number
            continue
        parsed.read(obj, number)
    if number == 0:
        raise bad(1, "the file is empty")
    if ends and not ended:  # (an export cut short at a line's end: written whole or not)
        raise bad(number + 1, "the file ends before its end line: it was cut short")
    parsed.facts.all_mapped()
    return parsed, number


def _standalone_or_owned(parsed: _File) -> None:
    """Every chunk's base is written: a base of its own, or a memory base's named by a
    memory base line."""
    owned = {mb["knowledge_base"] for mb in parsed.bases.bases.values()}
    for chunk in parsed.knowledge.chunks:
        kb = parsed.knowledge.bases[chunk["knowledge_base"]]
        if kb["memory_base"] and chunk["knowledge_base"] not in owned:
            raise bad(chunk["line"], "its memory base's knowledge base has no memory_base line")


def _embed(rows: list[dict[str, Any]], embedder: Embedder | None, default_model: str) -> int:
    """Give every row a vector of ``embedder``'s model (None: rows keep none), embedding
    the texts without one or with another model's; a vector of that model of another
    dimension is a bad line."""
    if embedder is None:
        for row in rows:
            row["embedding"] = None
        return 0
    dims = int(getattr(embedder, "dimensions", 0) or 0)
    todo = []
    for row in rows:
        same = (row["embedding_model"] or default_model) == embedder.model
        if row["embedding"] is None or not same:
            todo.append(row)
        elif dims and len(row["embedding"]) != dims:
            raise bad(row["line"], f"embedding has {len(row['embedding'])} dimensions, not {dims}")
    for start in range(0, len(todo), EMBED_BATCH):
        part = todo[start : start + EMBED_BATCH]
        texts = [str(r.get("content") or r.get("content_summary")) for r in part]
        for row, vec in zip(part, embedder.embed(texts), strict=True):
            row["embedding"] = [float(x) for x in vec]
    for row in rows:
        row["embedding_model"] = embedder.model
    return len(todo)


def import_lines(
    *,
    owner: AbstractBaseUser | int,
    lines: Iterable[str],
    scope_map: Mapping[str, str] | None = None,
    embedder: Embedder | None = None,
) -> ImportReport:
    """Import an export (see the module) into ``owner``; the report says what was new."""
    owner_id = owner_pk(owner)
    parsed, count = _parse(lines, scope_map)
    assert parsed.facts is not None
    ids = Ids(owner_id)
    ids.known.update({("flow", old): True for old in parsed.conversations.flows})
    _standalone_or_owned(parsed)
    parsed.knowledge.check(owner_id, ids)
    parsed.conversations.check(owner_id, ids)
    parsed.bases.check(owner_id, ids, parsed.knowledge.bases)
    parsed.stores.check(owner_id, ids)
    embedder = embedder or get_embedder()
    config = EmbeddingConfig(
        getattr(embedder, "provider", "") or EmbeddingConfig.from_settings().provider,
        embedder.model, int(getattr(embedder, "dimensions", 0) or 0),
    )  # fmt: skip
    report = ImportReport(lines=count)
    report.embedded += _embed(parsed.facts.embedded(), embedder, parsed.model)
    report.embedded += _embed(parsed.knowledge.chunks, embedder, parsed.model)
    for old, store_embedder in parsed.stores.embedders(ids).items():
        items = [i for i in parsed.stores.items if i["store"] == old]
        report.embedded += _embed(items, store_embedder, parsed.model)
    written: dict[str, int] = {}
    with transaction.atomic():
        written.update(parsed.conversations.write(owner_id, ids))
        written["knowledge_bases"] = parsed.knowledge.write_bases(owner_id, ids, config)
        written["memory_bases"] = parsed.bases.write(owner_id, ids, parsed.knowledge, config)
        written.update(parsed.stores.write(owner_id, ids))
        written["chunks"] = parsed.knowledge.write_chunks(ids)
        written.update(parsed.facts.write(owner_id, ids, timezone.now()))
    written["files"] = parsed.journals.write(owner_id)
    parsed.stores.load(ids)
    report.written = written
    return report
