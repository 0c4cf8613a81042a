"""Export and import of an owner's facts: its scopes, their current facts and every closed
version (``FactVersion``), global memories included (the facts of the global scope), as
JSON Lines (``FORMAT``, version ``VERSION``; the schema is ``docs/export-format.json``).

The first line is the header (``{"format", "version", "exported_at", "embedding_model",
"dimensions", "vectors"}``); then one object per line, each with its ``type``:
``scope`` (``path``, ``external_id``), ``fact`` (a current fact with the ``scopes`` that
hold it) and ``version`` (a closed version, in its ``scope``). Vectors are optional
(``vectors``: false leaves them out); an import embeds the texts again when the file has
none or when its embedding model is not the target's.

An import is idempotent: every id it writes is derived from the file's id and the
importing owner (``uuid5``), so the same file twice creates nothing new, and another
owner (or another deployment) importing it gets ids of its own. It is atomic for the
facts family: every line is read and checked first (a bad one is reported with its
line number and nothing is written), then everything is written in one transaction.
``scope_map`` renames scopes on the way in (``{"user/alice": "user/ann"}``; an end
user's id is its scope's second segment); a map that makes two scopes one is refused.
Imported facts are not deduplicated against the scope's facts nor trimmed to
``ENGINE_MAX_FACTS``: the file is taken as it is.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from core.errors import InvalidInput
from core.providers.embeddings import Embedder, get_embedder
from core.providers.tokens import count_tokens
from memories.facts.models import CATEGORIES, Fact, FactLink, FactVersion, Scope
from memories.facts.scopes import global_scope_ensure, owner_pk, scope_ensure, scope_parse
from memories.facts.services import fact_line, normalize_fact

FORMAT = "memory-export"
VERSION = 1
EMBED_BATCH = 256


# --- Export -----------------------------------------------------------------------------


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _vector(value: Any) -> list[float]:
    return [float(x) for x in value]


def export_lines(*, owner: AbstractBaseUser | int, vectors: bool = True) -> Iterator[str]:
    """The owner's facts as JSON Lines (see the module), one string per line (no
    newline), streamed: facts and versions are read in batches."""
    owner_id = owner_pk(owner)
    yield json.dumps({
        "format": FORMAT, "version": VERSION, "exported_at": timezone.now().isoformat(),
        "embedding_model": settings.EMBEDDING_MODEL, "vectors": vectors,
    })  # fmt: skip
    scopes = {s.pk: s for s in Scope.objects.filter(owner_id=owner_id).order_by("id")}
    for scope in scopes.values():
        yield json.dumps({"type": "scope", "path": list(scope.path),
                          "external_id": scope.external_id})  # fmt: skip
    links: dict[uuid.UUID, list[list[str]]] = {}
    for scope_id, fact_id in FactLink.objects.filter(scope__owner_id=owner_id).values_list(
        "scope_id", "fact_id"
    ):
        links.setdefault(fact_id, []).append(list(scopes[scope_id].path))
    facts = Fact.objects.filter(owner_id=owner_id).order_by("created_at", "id")
    if not vectors:
        facts = facts.defer("embedding")
    for fact in facts.iterator(chunk_size=2000):
        line = {
            "type": "fact", "id": str(fact.pk), "scopes": sorted(links.get(fact.pk, [])),
            **_fields(fact), "created_at": _time(fact.created_at),
            "recorded_from": _time(fact.recorded_from), "embedding_model": fact.embedding_model,
        }  # fmt: skip
        if vectors:
            line["embedding"] = _vector(fact.embedding)
        yield json.dumps(line)
    versions = FactVersion.objects.filter(owner_id=owner_id).order_by("recorded_to", "id")
    if not vectors:
        versions = versions.defer("embedding")
    for version in versions.iterator(chunk_size=2000):
        line = {
            "type": "version", "id": str(version.pk), "fact_id": str(version.fact_id),
            "scope": list(scopes[version.scope_id].path), **_fields(version),
            "created_at": _time(version.created_at),
            "recorded_from": _time(version.recorded_from),
            "recorded_to": _time(version.recorded_to), "action": version.action,
            "reason": version.reason, "closed_by": version.source,
            "successor": str(version.successor_id) if version.successor_id else None,
            "superseded": version.superseded, "embedding_model": version.embedding_model,
        }  # fmt: skip
        if vectors:
            line["embedding"] = _vector(version.embedding)
        yield json.dumps(line)


def _fields(row: Fact | FactVersion) -> dict[str, Any]:
    return {
        "content": row.content, "category": row.category, "confidence": row.confidence,
        "source": {"kind": row.source_kind, "ref": row.source_ref}, "metadata": row.metadata,
        "observed_at": _time(row.observed_at), "valid_from": _time(row.valid_from),
        "valid_to": _time(row.valid_to),
    }  # fmt: skip


# --- Import -----------------------------------------------------------------------------


class InvalidImport(InvalidInput):
    code = "invalid_import"


def _bad(line: int, why: str) -> InvalidImport:
    return InvalidImport(f"line {line}: {why}", details={"line": line, "error": why})


@dataclass
class ImportReport:
    """What an import wrote (rows new to the database: a second import of the same
    file writes none) and how many texts it embedded again."""

    scopes: int = 0
    facts: int = 0
    versions: int = 0
    embedded: int = 0
    lines: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Parsed:
    scopes: dict[tuple[str, ...], str | None] = field(default_factory=dict)
    facts: list[dict[str, Any]] = field(default_factory=list)
    versions: list[dict[str, Any]] = field(default_factory=list)
    model: str = ""


def _when(value: Any, line: int, name: str, required: bool = False) -> datetime | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise _bad(line, f"{name} is not a time")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise _bad(line, f"{name} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        raise _bad(line, f"{name} has no time zone")
    return when


def _path(
    value: Any, line: int, mapping: Mapping[tuple[str, ...], tuple[str, ...]]
) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise _bad(line, "a scope is a list of strings")
    path = tuple(value)
    path = mapping.get(path, path)
    if path:
        try:
            scope_parse(list(path))
        except InvalidInput as exc:
            raise _bad(line, f"scope {list(path)}: {exc}") from None
    return path


def _common(obj: dict[str, Any], line: int) -> dict[str, Any]:
    content = obj.get("content")
    if not isinstance(content, str) or not content.strip():
        raise _bad(line, "content is missing")
    if obj.get("category") not in CATEGORIES:
        raise _bad(line, f"category {obj.get('category')!r} is not a category")
    confidence = obj.get("confidence")
    if not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        raise _bad(line, "confidence is not a number from 0 to 1")
    source = obj.get("source") or {}
    if not isinstance(source, dict):
        raise _bad(line, "source is not an object")
    embedding = obj.get("embedding")
    if embedding is not None:
        if not isinstance(embedding, list) or not all(
            isinstance(x, int | float) for x in embedding
        ):
            raise _bad(line, "embedding is not a list of numbers")
    return {
        "line": line,
        "content": content, "category": obj["category"], "confidence": float(confidence),
        "source_kind": str(source.get("kind") or "import")[:16],
        "source_ref": str(source.get("ref") or "")[:255],
        "metadata": obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {},
        "observed_at": _when(obj.get("observed_at"), line, "observed_at", required=True),
        "valid_from": _when(obj.get("valid_from"), line, "valid_from"),
        "valid_to": _when(obj.get("valid_to"), line, "valid_to"),
        "created_at": _when(obj.get("created_at"), line, "created_at", required=True),
        "recorded_from": _when(obj.get("recorded_from"), line, "recorded_from", required=True),
        "embedding": embedding, "embedding_model": obj.get("embedding_model") or "",
    }  # fmt: skip


def _scope_map(raw: Mapping[str, str] | None) -> dict[tuple[str, ...], tuple[str, ...]]:
    """``{"user/alice": "user/ann"}`` as paths; two scopes mapped to one is refused."""
    mapping = {tuple(k.split("/")): tuple(v.split("/")) for k, v in (raw or {}).items()}
    targets = list(mapping.values())
    if len(set(targets)) != len(targets):
        raise InvalidInput("the scope map sends two scopes to one", details={"scope_map": raw})
    return mapping


def _parse(lines: Iterable[str], mapping: Mapping[tuple[str, ...], tuple[str, ...]]) -> _Parsed:
    parsed = _Parsed()
    number = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            raise _bad(number, "not a JSON object (a truncated line?)") from None
        if not isinstance(obj, dict):
            raise _bad(number, "not a JSON object")
        if number == 1:
            if obj.get("format") != FORMAT or obj.get("version") != VERSION:
                raise _bad(1, f"not a {FORMAT} file of version {VERSION}: "
                              f"{obj.get('format')!r} version {obj.get('version')!r}")  # fmt: skip
            parsed.model = str(obj.get("embedding_model") or "")
            continue
        kind = obj.get("type")
        if kind == "scope":
            path = _path(obj.get("path"), number, mapping)
            external = path[1] if len(path) == 2 and path[0] == "user" else None
            parsed.scopes[path] = external
        elif kind == "fact":
            row = _common(obj, number)
            row["id"] = _uuid(obj.get("id"), number)
            row["scopes"] = [_path(p, number, mapping) for p in obj.get("scopes") or []]
            if not row["scopes"]:
                raise _bad(number, "a fact needs the scopes that hold it")
            parsed.facts.append(row)
        elif kind == "version":
            row = _common(obj, number)
            row["id"] = _uuid(obj.get("id"), number)
            row["fact_id"] = _uuid(obj.get("fact_id"), number)
            row["successor"] = _uuid(obj["successor"], number) if obj.get("successor") else None
            row["scope"] = _path(obj.get("scope"), number, mapping)
            row["recorded_to"] = _when(obj.get("recorded_to"), number, "recorded_to", True)
            row["action"] = str(obj.get("action") or "update")[:16]
            row["reason"] = str(obj.get("reason") or "")
            row["closed_by"] = (
                obj.get("closed_by") if isinstance(obj.get("closed_by"), dict) else {}
            )
            row["superseded"] = bool(obj.get("superseded"))
            parsed.versions.append(row)
        else:
            raise _bad(number, f"unknown type {kind!r}")
    if number == 0:
        raise _bad(1, "the file is empty")
    for row in parsed.facts:
        for path in row["scopes"]:
            parsed.scopes.setdefault(
                path, path[1] if len(path) == 2 and path[0] == "user" else None
            )
    for row in parsed.versions:
        parsed.scopes.setdefault(row["scope"], None)
    return parsed


def _uuid(value: Any, line: int) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise _bad(line, f"{value!r} is not an id") from None


def import_lines(
    *,
    owner: AbstractBaseUser | int,
    lines: Iterable[str],
    scope_map: Mapping[str, str] | None = None,
    embedder: Embedder | None = None,
) -> ImportReport:
    """Import an export (see the module) into ``owner``'s memory; the report says what
    was new. Every line is checked before anything is written."""
    owner_id = owner_pk(owner)
    embedder = embedder or get_embedder()
    parsed = _parse(lines, _scope_map(scope_map))
    _check_dimensions(parsed, embedder)
    report = ImportReport(lines=1 + len(parsed.scopes) + len(parsed.facts) + len(parsed.versions))
    report.embedded = _embed_missing(parsed, embedder)
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, f"memory-import:{owner_id}")

    def new(old: uuid.UUID | None) -> uuid.UUID | None:
        return uuid.uuid5(namespace, str(old)) if old is not None else None

    with transaction.atomic():
        rows: dict[tuple[str, ...], Scope] = {}
        for path in parsed.scopes:
            before = Scope.objects.filter(owner_id=owner_id, path=list(path)).exists()
            rows[path] = (
                scope_ensure(owner=owner_id, scope=path) if path else
                global_scope_ensure(owner=owner_id)
            )  # fmt: skip
            report.scopes += 0 if before else 1
        now = timezone.now()
        with connection.cursor() as cur:
            for row in parsed.facts:
                report.facts += _insert_fact(
                    cur, owner_id, row, new(row["id"]), rows, embedder, now
                )
            for row in parsed.versions:
                report.versions += _insert_version(cur, owner_id, row, new, rows, embedder)
    return report


def _check_dimensions(parsed: _Parsed, embedder: Embedder) -> None:
    """A vector of the target's model must have its dimensions (else the line is bad)."""
    dims = int(getattr(embedder, "dimensions", 0) or 0)
    for r in (*parsed.facts, *parsed.versions):
        same = (r["embedding_model"] or parsed.model) == embedder.model
        if dims and same and r["embedding"] is not None and len(r["embedding"]) != dims:
            raise _bad(r["line"], f"embedding has {len(r['embedding'])} dimensions, not {dims}")


def _embed_missing(parsed: _Parsed, embedder: Embedder) -> int:
    """Embed the texts the file has no vector for, or whose vectors are of another model
    than the target's (each of the file's rows then gets the target's model)."""
    todo = [r for r in (*parsed.facts, *parsed.versions)
            if r["embedding"] is None or (r["embedding_model"] or parsed.model) != embedder.model]  # fmt: skip
    for start in range(0, len(todo), EMBED_BATCH):
        part = todo[start : start + EMBED_BATCH]
        vectors = embedder.embed([r["content"] for r in part])
        for r, v in zip(part, vectors, strict=True):
            r["embedding"] = [float(x) for x in v]
    for r in (*parsed.facts, *parsed.versions):
        r["embedding_model"] = embedder.model
    return len(todo)


_FACT_INSERT = (
    "INSERT INTO memories_fact (id, owner_id, content, normalized, scope_id, category, "
    "confidence, source_kind, source_ref, embedding, embedding_model, dimensions, metadata, "
    "tokens, observed_at, valid_from, valid_to, recorded_at, created_at, updated_at) VALUES "
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::vector, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (id) DO NOTHING RETURNING id"
)
_LINK_INSERT = (
    "INSERT INTO memories_factlink (scope_id, fact_id, shared, created_at) VALUES "
    "(%s, %s, %s, %s) ON CONFLICT DO NOTHING"
)


def _insert_fact(cur: Any, owner_id: int, row: dict[str, Any], fact_id: Any,
                 scopes: dict[tuple[str, ...], Scope], embedder: Embedder, now: datetime) -> int:  # fmt: skip
    held = [scopes[p] for p in row["scopes"]]
    single = held[0].pk if len(held) == 1 else None
    tokens = count_tokens(fact_line(_Line(row["category"], row["confidence"], row["content"])))
    cur.execute(_FACT_INSERT, [
        fact_id, owner_id, row["content"], normalize_fact(row["content"]), single,
        row["category"], row["confidence"], row["source_kind"], row["source_ref"],
        _literal(row["embedding"]), row["embedding_model"], len(row["embedding"]),
        Jsonb(row["metadata"]), tokens, row["observed_at"], row["valid_from"], row["valid_to"],
        row["recorded_from"], row["created_at"], now,
    ])  # fmt: skip
    if cur.fetchone() is None:
        return 0
    for scope in held:
        cur.execute(_LINK_INSERT, [scope.pk, fact_id, len(held) > 1, now])
    return 1


def _literal(vector: list[float]) -> str:
    """A vector as pgvector's text (a float's repr reads back as the same float)."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


@dataclass(frozen=True)
class _Line:
    category: str
    confidence: float
    content: str


_VERSION_INSERT = (
    "INSERT INTO memories_factversion (id, fact_id, owner_id, scope_id, content, category, "
    "confidence, source_kind, source_ref, metadata, embedding, embedding_model, dimensions, "
    "tokens, observed_at, valid_from, valid_to, recorded_from, recorded_to, created_at, "
    "updated_at, successor_id, action, reason, source, superseded) VALUES (%s, %s, %s, %s, "
    "%s, %s, %s, %s, %s, %s, %s::vector, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s) ON CONFLICT (id) DO NOTHING RETURNING id"
)


def _insert_version(cur: Any, owner_id: int, row: dict[str, Any], new: Any,
                    scopes: dict[tuple[str, ...], Scope], embedder: Embedder) -> int:  # fmt: skip
    recorded_from = min(row["recorded_from"], row["recorded_to"])
    cur.execute(_VERSION_INSERT, [
        new(row["id"]), new(row["fact_id"]), owner_id, scopes[row["scope"]].pk, row["content"],
        row["category"], row["confidence"], row["source_kind"], row["source_ref"],
        Jsonb(row["metadata"]), _literal(row["embedding"]), row["embedding_model"],
        len(row["embedding"]), None, row["observed_at"], row["valid_from"], row["valid_to"],
        recorded_from, row["recorded_to"], row["created_at"], row["recorded_to"],
        new(row["successor"]), row["action"], row["reason"], Jsonb(row["closed_by"]),
        row["superseded"],
    ])  # fmt: skip
    return 1 if cur.fetchone() is not None else 0
