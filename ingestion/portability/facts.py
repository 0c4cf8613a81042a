"""The facts family: an owner's scopes, their current facts and every closed version
(``FactVersion``), global memories included (the facts of the global scope ``[]``).

Lines: ``scope`` (``path``, ``external_id``), ``fact`` (a current fact, the ``scopes``
that hold it, its times) and ``version`` (a closed version in its ``scope``, with
``recorded_to``, ``action``, ``reason``, ``closed_by``, ``successor``, ``superseded``).
``scope_map`` renames scopes on the way in (``{"user/alice": "user/ann"}``: an end
user's id is its scope's second segment); a map that makes two scopes one is refused.
Imported facts are taken as the file has them: not deduplicated against the scope's
facts, not trimmed to ``ENGINE_MAX_FACTS``. A newer export of facts imported before
brings the source's edits and deletions since (``_close_current``); a change made in the
copy since is kept.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db import connection
from django.db.models.functions import Coalesce
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from core.errors import InvalidInput
from core.providers.tokens import count_tokens
from ingestion.portability.common import (
    Ids,
    RawJSON,
    bad,
    checked_metadata,
    embedding,
    iso,
    old_id,
    vector_text,
    when,
)
from memories.facts.models import CATEGORIES, Fact, FactLink, FactVersion, Scope
from memories.facts.scopes import global_scope_ensure, scope_ensure, scope_parse
from memories.facts.services import MAX_FACT_CHARS, fact_line, normalize_fact, scope_lock
from memories.facts.tasks import enqueue_fact_indexing

Path = tuple[str, ...]


def export(owner_id: int, vectors: bool) -> Iterator[dict[str, Any]]:
    scopes = {s.pk: s for s in Scope.objects.filter(owner_id=owner_id).order_by("path")}
    for scope in scopes.values():
        yield {"type": "scope", "path": list(scope.path), "external_id": scope.external_id}
    links: dict[uuid.UUID, list[list[str]]] = {}
    pairs = FactLink.objects.filter(scope__owner_id=owner_id).values_list("scope_id", "fact_id")
    for scope_id, fact_id in pairs:
        links.setdefault(fact_id, []).append(list(scopes[scope_id].path))
    facts = Fact.objects.filter(owner_id=owner_id).order_by("created_at", "content", "id")
    facts = (
        facts.defer("embedding").annotate(vector=vector_text())
        if vectors
        else facts.defer("embedding")
    )
    for fact in facts.iterator(chunk_size=2000):
        yield {
            "type": "fact", "id": str(fact.pk), "scopes": sorted(links.get(fact.pk, [])),
            **_fields(fact, vectors), "recorded_from": iso(fact.recorded_from),
        }  # fmt: skip
    versions = FactVersion.objects.filter(owner_id=owner_id).order_by(
        "recorded_to", "recorded_from", "content", "id"
    )
    versions = versions.defer("embedding")
    for v in (versions.annotate(vector=vector_text()) if vectors else versions).iterator(
        chunk_size=2000
    ):
        yield {
            "type": "version", "id": str(v.pk), "fact_id": str(v.fact_id),
            "scope": list(scopes[v.scope_id].path), **_fields(v, vectors),
            "recorded_from": iso(v.recorded_from), "recorded_to": iso(v.recorded_to),
            "action": v.action, "reason": v.reason, "closed_by": v.source,
            "successor": str(v.successor_id) if v.successor_id else None,
            "superseded": v.superseded,
        }  # fmt: skip


def _fields(row: Fact | FactVersion, vectors: bool) -> dict[str, Any]:
    out = {
        "content": row.content, "category": row.category, "confidence": row.confidence,
        "source": {"kind": row.source_kind, "ref": row.source_ref}, "metadata": row.metadata,
        "observed_at": iso(row.observed_at), "valid_from": iso(row.valid_from),
        "valid_to": iso(row.valid_to), "created_at": iso(row.created_at),
        "embedding_model": row.embedding_model,
    }  # fmt: skip
    if vectors:
        out["embedding"] = RawJSON(row.vector)  # type: ignore[union-attr]  # (annotated)
    return out


# --- Import -----------------------------------------------------------------------------


def scope_map(raw: Mapping[str, str] | None) -> dict[Path, Path]:
    """``{"user/alice": "user/ann"}`` as paths; two scopes mapped to one is refused."""
    mapping = {tuple(k.split("/")): tuple(v.split("/")) for k, v in (raw or {}).items()}
    targets = list(mapping.values())
    if len(set(targets)) != len(targets):
        raise InvalidInput("the scope map sends two scopes to one", details={"scope_map": raw})
    for target in targets:
        try:
            scope_parse(list(target))
        except InvalidInput as exc:
            raise InvalidInput(f"scope_map: {exc}", details={"scope_map": raw}) from None
    return mapping


@dataclass
class Facts:
    """The facts family of one import: ``parse`` each line, then ``write``."""

    mapping: dict[Path, Path]
    scopes: dict[Path, str | None] = field(default_factory=dict)
    facts: list[dict[str, Any]] = field(default_factory=list)
    versions: list[dict[str, Any]] = field(default_factory=list)
    mapped: set[Path] = field(default_factory=set)  # the map's scopes the file has
    variants: dict[str, str] = field(default_factory=dict)  # a fact's id: its renamings
    lines: dict[str, int] = field(default_factory=dict)  # a fact's id: its line
    types = ("scope", "fact", "version")

    def all_mapped(self) -> None:
        """A map naming a scope the file does not have (a typo: ``user/alcie``) is
        refused, rather than the file imported unrenamed."""
        missing = ["/".join(k) for k in self.mapping if k not in self.mapped]
        if missing:
            raise InvalidInput(
                f"scope_map: the file has no scope {', '.join(missing)}",
                details={"scope_map": {"/".join(k): "/".join(v) for k, v in self.mapping.items()}},
            )

    def path(self, value: Any, line: int) -> Path:
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise bad(line, "a scope is a list of strings")
        if tuple(value) not in self.mapping and tuple(value) in self.mapping.values():
            raise InvalidInput(
                f"the scope map renames a scope to {'/'.join(value)}, which the file has too",
                details={"scope_map": {"/".join(k): "/".join(v) for k, v in self.mapping.items()},
                         "line": line},
            )  # fmt: skip
        if tuple(value) in self.mapping:
            self.mapped.add(tuple(value))
        path = self.mapping.get(tuple(value), tuple(value))
        if path:
            try:
                scope_parse(list(path))
            except InvalidInput as exc:
                raise bad(line, f"scope {list(path)}: {exc}") from None
        self.scopes.setdefault(path, path[1] if len(path) == 2 and path[0] == "user" else None)
        return path

    def renamed(self, paths: list[Any]) -> str:
        """The renamings of the map that place a row (its ids' ``variant``): a fact of a
        scope mapped away is another row than the same fact imported where it was (the
        file imported first with the map, then without it, wrote no fact the second
        time, their ids taken, and left an empty scope); with the same map, the same. A
        scope mapped to itself is not renamed (it placed a second copy of each fact)."""
        moved = {k: v for k, v in self.mapping.items() if k != v}
        said = {f"{'/'.join(p)}>{'/'.join(moved[tuple(p)])}" for p in paths
                if isinstance(p, list) and tuple(p) in moved}  # fmt: skip
        return ",".join(sorted(said))

    def parse(self, obj: dict[str, Any], line: int) -> None:
        kind = obj["type"]
        if kind == "scope":
            self.path(obj.get("path"), line)
            return
        row = _common(obj, line)
        row["id"] = old_id(obj.get("id"), line)
        if kind == "fact":
            # (the second was dropped by the insert, its id taken, after being embedded)
            if row["id"] in self.lines:
                raise bad(line, f"id {row['id']} is the fact of line {self.lines[row['id']]} too")
            self.lines[row["id"]] = line
            row["scopes"] = [self.path(p, line) for p in obj.get("scopes") or []]
            if not row["scopes"]:
                raise bad(line, "a fact needs the scopes that hold it")
            row["variant"] = self.variants[row["id"]] = self.renamed(obj["scopes"])
            self.facts.append(row)
            return
        row["fact_id"] = old_id(obj.get("fact_id"), line, "fact_id")
        row["successor"] = str(obj["successor"]) if obj.get("successor") else None
        row["scope"] = self.path(obj.get("scope"), line)
        row["variant"] = self.renamed([obj.get("scope")])
        row["recorded_to"] = when(obj.get("recorded_to"), line, "recorded_to", True, past=True)
        row["action"] = str(obj.get("action") or "update")[:16]
        row["reason"] = str(obj.get("reason") or "")
        closed_by = obj.get("closed_by")
        row["closed_by"] = closed_by if isinstance(closed_by, dict) else {}
        row["superseded"] = bool(obj.get("superseded"))
        self.versions.append(row)

    def embedded(self) -> list[dict[str, Any]]:
        """The rows carrying a text and a vector (``embed`` fills the missing ones)."""
        return [*self.facts, *self.versions]

    def write(self, owner_id: int, ids: Ids, now: Any) -> dict[str, int]:
        counts = {"scopes": 0, "facts": 0, "versions": 0}
        rows: dict[Path, Scope] = {}
        for path in self.scopes:
            before = Scope.objects.filter(owner_id=owner_id, path=list(path)).exists()
            rows[path] = (
                scope_ensure(owner=owner_id, scope=path) if path
                else global_scope_ensure(owner=owner_id)
            )  # fmt: skip
            counts["scopes"] += 0 if before else 1
        closes = [_closes(v, ids, rows, self.variants) for v in self.versions]
        _close_current(closes, owner_id)
        known = _closed_until(closes, owner_id, {ids.new("fact", f["id"], f["variant"])
                                                 for f in self.facts})  # fmt: skip
        counts["facts"] = _copy_facts(self.facts, owner_id, ids, rows, now, known)
        counts["versions"] = _copy_versions(self.versions, owner_id, ids, rows, self.variants)
        if counts["facts"]:
            enqueue_fact_indexing(on_commit=True)
        return counts


def _common(obj: dict[str, Any], line: int) -> dict[str, Any]:
    content = obj.get("content")
    if not isinstance(content, str) or not content.strip():
        raise bad(line, "content is missing")
    if obj.get("category") not in CATEGORIES:
        raise bad(line, f"category {obj.get('category')!r} is not a category")
    confidence = obj.get("confidence")
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, int | float)
        or not (0 <= confidence <= 1)
    ):
        raise bad(line, "confidence is not a number from 0 to 1")
    if len(content) > MAX_FACT_CHARS:
        raise bad(line, f"content is longer than {MAX_FACT_CHARS} characters")
    source = obj.get("source") or {}
    if not isinstance(source, dict):
        raise bad(line, "source is not an object")
    metadata = obj.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad(line, "metadata is not an object")
    if metadata:
        checked_metadata(metadata, line)
    valid_from = when(obj.get("valid_from"), line, "valid_from")
    valid_to = when(obj.get("valid_to"), line, "valid_to")
    if valid_from is not None and valid_to is not None and valid_to <= valid_from:
        raise bad(line, "valid_to is not after valid_from")
    return {
        "line": line, "content": content, "category": obj["category"],
        "confidence": float(confidence), "source_kind": str(source.get("kind") or "import")[:16],
        "source_ref": str(source.get("ref") or "")[:255],
        "metadata": metadata if isinstance(metadata, dict) else {},
        "observed_at": when(obj.get("observed_at"), line, "observed_at", True, past=True),
        "valid_from": valid_from, "valid_to": valid_to,
        "created_at": when(obj.get("created_at"), line, "created_at", True, past=True),
        "recorded_from": when(obj.get("recorded_from"), line, "recorded_from", True, past=True),
        "embedding": embedding(obj, line), "embedding_model": obj.get("embedding_model") or "",
    }  # fmt: skip


# A newer export of what was imported before (the source edited or deleted a fact since)
# holds the version closing the copy's current fact. Its row and that version were both
# kept (the row's insert did nothing, its id taken): the edit never arrived, the history
# showed the version twice and reads in time the same id twice. Now the copy follows the
# file: each version closes the copy's fact in its scope when it is the state the copy
# holds (recorded from the same time), and a fact line is not placed in a scope where the
# copy already holds a later end of it (an older file imported after a newer, or a fact
# deleted here since). A change made here since the import is kept: the file's versions
# of a state the copy already closed are not written.


def _closes(row: dict[str, Any], ids: Ids, scopes: dict[Path, Scope],
            variants: dict[str, str]) -> tuple[uuid.UUID, int, Any, Any]:  # fmt: skip
    """A version line's fact (the copy's id), scope, and recorded interval."""
    fact = variants.get(row["fact_id"], row["variant"])
    start = min(row["recorded_from"], row["recorded_to"])
    return ids.new("fact", row["fact_id"], fact), scopes[row["scope"]].pk, start, row["recorded_to"]


def _close_current(closes: list[tuple[uuid.UUID, int, Any, Any]], owner_id: int) -> None:
    """Unlink the copy's current facts the file's versions close; a fact no scope holds
    then goes, as ``fact_delete`` does. Each scope's lock is held first, as the fact
    services hold it (a change of the fact beside the import failed once it was gone)."""
    held = Scope.objects.filter(owner_id=owner_id, pk__in={c[1] for c in closes})
    for row in held.order_by("pk"):
        scope_lock(scope=row)
    since = dict(
        Fact.objects.filter(owner_id=owner_id, pk__in={c[0] for c in closes})
        .annotate(since=Coalesce("recorded_at", "created_at"))
        .values_list("pk", "since")
    )
    closed = {(fact, scope) for fact, scope, start, _ in closes if since.get(fact) == start}
    for fact, scope in closed:
        FactLink.objects.filter(fact_id=fact, scope_id=scope).delete()
    Fact.objects.filter(pk__in={f for f, _ in closed}, links__isnull=True).delete()


def _closed_until(closes: list[tuple[uuid.UUID, int, Any, Any]], owner_id: int,
                  facts: set[uuid.UUID]) -> dict[tuple[uuid.UUID, int], Any]:  # fmt: skip
    """The latest end the copy or the file records of each fact in each scope."""
    ends: dict[tuple[uuid.UUID, int], Any] = {}
    held = FactVersion.objects.filter(owner_id=owner_id, fact_id__in=facts)
    rows = held.values_list("fact_id", "scope_id", "recorded_to")
    for fact, scope, end in [*rows, *((f, s, e) for f, s, _, e in closes if f in facts)]:
        ends[(fact, scope)] = max(end, ends.get((fact, scope), end))
    return ends


# Facts and versions are written in bulk: binary COPY into a temporary table, then one
# INSERT ... SELECT each (ON CONFLICT: a second import writes nothing). Imported facts
# are ``index_pending``: the background indexer puts them in the HNSW indexes.
_FACT_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS import_fact (id uuid, content text, normalized text, "
    "scope_id bigint, links text, category text, confidence float8, source_kind text, "
    "source_ref text, embedding vector, embedding_model text, dimensions int4, metadata jsonb, "
    "tokens int4, observed_at timestamptz, valid_from timestamptz, valid_to timestamptz, "
    "recorded_at timestamptz, created_at timestamptz) ON COMMIT DROP"
)
_FACT_TYPES = ["uuid", "text", "text", "int8", "text", "text", "float8", "text", "text",
               "vector", "text", "int4", "jsonb", "int4", "timestamptz", "timestamptz",
               "timestamptz", "timestamptz", "timestamptz"]  # fmt: skip
_FACT_COLUMNS = (
    "id, content, normalized, scope_id, links, category, confidence, source_kind, "
    "source_ref, embedding, embedding_model, dimensions, metadata, tokens, observed_at, "
    "valid_from, valid_to, recorded_at, created_at"
)
_FACT_MOVE = (
    "WITH f AS (INSERT INTO memories_fact (id, owner_id, content, normalized, scope_id, "
    "category, confidence, source_kind, source_ref, embedding, embedding_model, dimensions, "
    "metadata, tokens, observed_at, valid_from, valid_to, recorded_at, created_at, updated_at, "
    "index_pending) SELECT id, %s, content, normalized, scope_id, category, confidence, "
    "source_kind, source_ref, embedding, embedding_model, dimensions, metadata, tokens, "
    "observed_at, valid_from, valid_to, recorded_at, created_at, %s, true FROM import_fact "
    "ON CONFLICT (id) DO NOTHING RETURNING id), "
    "l AS (INSERT INTO memories_factlink (scope_id, fact_id, shared, created_at) "
    "SELECT s::bigint, i.id, cardinality(string_to_array(i.links, ',')) > 1, %s "
    "FROM f JOIN import_fact i ON i.id = f.id, unnest(string_to_array(i.links, ',')) s "
    "ON CONFLICT DO NOTHING) SELECT count(*) FROM f"
)


@dataclass(frozen=True)
class _Line:
    category: str
    confidence: float
    content: str


def _raw() -> Any:
    connection.ensure_connection()
    raw = connection.connection
    register_vector(raw)
    return raw


def _copy_facts(facts: list[dict[str, Any]], owner_id: int, ids: Ids, scopes: dict[Path, Scope],
                now: Any, closed: dict[tuple[uuid.UUID, int], Any]) -> int:  # fmt: skip
    if not facts:
        return 0
    with _raw().cursor() as cur:
        cur.execute(_FACT_STAGE)
        cur.execute("TRUNCATE import_fact")
        with cur.copy(f"COPY import_fact ({_FACT_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(_FACT_TYPES)
            for row in facts:
                pk = ids.new("fact", row["id"], row["variant"])
                held = [scopes[p].pk for p in dict.fromkeys(row["scopes"])
                        if closed.get((pk, scopes[p].pk), row["recorded_from"])
                        <= row["recorded_from"]]  # fmt: skip
                if not held:
                    continue
                line = fact_line(_Line(row["category"], row["confidence"], row["content"]))
                copy.write_row((
                    pk, row["content"],
                    normalize_fact(row["content"]),
                    held[0] if len(held) == 1 else None, ",".join(map(str, held)),
                    row["category"], row["confidence"], row["source_kind"], row["source_ref"],
                    np.asarray(row["embedding"], dtype=np.float32), row["embedding_model"],
                    len(row["embedding"]), Jsonb(row["metadata"]), count_tokens(line),
                    row["observed_at"], row["valid_from"], row["valid_to"],
                    row["recorded_from"], row["created_at"],
                ))  # fmt: skip
        cur.execute(_FACT_MOVE, [owner_id, now, now])
        return int(cur.fetchone()[0])


_VERSION_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS import_version (id uuid, fact_id uuid, scope_id bigint, "
    "content text, category text, confidence float8, source_kind text, source_ref text, "
    "metadata jsonb, embedding vector, embedding_model text, dimensions int4, "
    "observed_at timestamptz, valid_from timestamptz, valid_to timestamptz, "
    "recorded_from timestamptz, recorded_to timestamptz, created_at timestamptz, "
    "successor_id uuid, action text, reason text, source jsonb, superseded bool) "
    "ON COMMIT DROP"
)
_VERSION_TYPES = ["uuid", "uuid", "int8", "text", "text", "float8", "text", "text", "jsonb",
                  "vector", "text", "int4", "timestamptz", "timestamptz", "timestamptz",
                  "timestamptz", "timestamptz", "timestamptz", "uuid", "text", "text", "jsonb",
                  "bool"]  # fmt: skip
_VERSION_COLUMNS = (
    "id, fact_id, scope_id, content, category, confidence, source_kind, source_ref, metadata, "
    "embedding, embedding_model, dimensions, observed_at, valid_from, valid_to, recorded_from, "
    "recorded_to, created_at, successor_id, action, reason, source, superseded"
)
_VERSION_MOVE = (
    f"WITH v AS (INSERT INTO memories_factversion ({_VERSION_COLUMNS}, owner_id, updated_at) "
    f"SELECT {_VERSION_COLUMNS}, %s, recorded_to FROM import_version i "
    # (a state of the fact the copy closed itself: the file's end of it is not written)
    "WHERE NOT EXISTS (SELECT FROM memories_factversion o WHERE o.owner_id = %s "
    "AND o.fact_id = i.fact_id AND o.scope_id = i.scope_id "
    "AND o.recorded_from = i.recorded_from) "
    "ON CONFLICT (id) DO NOTHING RETURNING id) SELECT count(*) FROM v"
)


def _copy_versions(versions: list[dict[str, Any]], owner_id: int, ids: Ids,
                   scopes: dict[Path, Scope], variants: dict[str, str]) -> int:  # fmt: skip
    if not versions:
        return 0
    with _raw().cursor() as cur:
        cur.execute(_VERSION_STAGE)
        cur.execute("TRUNCATE import_version")
        with cur.copy(
            f"COPY import_version ({_VERSION_COLUMNS}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(_VERSION_TYPES)
            for row in versions:
                # (a fact the file no longer holds, deleted: placed where its version was)
                fact, successor = (variants.get(i, row["variant"]) if i else ""
                                   for i in (row["fact_id"], row["successor"]))  # fmt: skip
                copy.write_row((
                    ids.new("version", row["id"], fact),  # (a version is its fact's)
                    ids.new("fact", row["fact_id"], fact),
                    scopes[row["scope"]].pk, row["content"], row["category"], row["confidence"],
                    row["source_kind"], row["source_ref"], Jsonb(row["metadata"]),
                    np.asarray(row["embedding"], dtype=np.float32), row["embedding_model"],
                    len(row["embedding"]), row["observed_at"], row["valid_from"],
                    row["valid_to"], min(row["recorded_from"], row["recorded_to"]),
                    row["recorded_to"], row["created_at"],
                    ids.maybe("fact", row["successor"], successor),
                    row["action"], row["reason"], Jsonb(row["closed_by"]), row["superseded"],
                ))  # fmt: skip
        cur.execute(_VERSION_MOVE, [owner_id, owner_id])
        return int(cur.fetchone()[0])
