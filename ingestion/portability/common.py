"""What every family of an export shares: the format's name and version, the import's
error (a bad line, named by its number), times, vectors and the id map."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from core.api.fields import VECTOR_REFUSALS, metadata_refusal, vector_refusal
from core.errors import InvalidInput
from core.times import RANGE, storable

FORMAT = "memory-export"
VERSION = 1


class InvalidImport(InvalidInput):
    code = "invalid_import"


def bad(line: int, why: str) -> InvalidImport:
    return InvalidImport(f"line {line}: {why}", details={"line": line, "error": why})


def checked_metadata(value: dict[str, Any], line: int) -> dict[str, Any]:
    """A line's metadata object, refused as the API refuses it when it is too large."""
    if value and (refused := metadata_refusal(value)):
        raise bad(line, f"metadata: {refused}")
    return value


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def vector(value: Any) -> list[float] | None:
    return None if value is None else [float(x) for x in value]


class RawJSON(str):
    """JSON text written into a line as it is: a vector as PostgreSQL prints it
    (``[0.1,-0.2,...]``, each float4 in its shortest form), read with ``VECTOR_TEXT``
    instead of parsed into Python floats and printed again (most of an export's time)."""


def vector_text() -> Any:
    """The ``embedding`` column as its text, for ``RawJSON``."""
    from django.db.models import TextField
    from django.db.models.functions import Cast

    return Cast("embedding", output_field=TextField())


def dumps(line: dict[str, Any]) -> str:
    """A line as JSON, its ``RawJSON`` values written as they are."""
    raw = {k: v for k, v in line.items() if isinstance(v, RawJSON)}
    if not raw:
        return json.dumps(line)
    text = json.dumps({k: v for k, v in line.items() if k not in raw})
    extra = "".join(f", {json.dumps(k)}: {v}" for k, v in raw.items())
    return text[:-1] + extra + "}" if text != "{}" else "{" + extra[2:] + "}"


def literal(values: list[float]) -> str:
    """A vector as pgvector's text (a float's repr reads back as the same float)."""
    return "[" + ",".join(repr(float(x)) for x in values) + "]"


# How far a time the service recorded may lie ahead of this clock: another
# deployment's clock runs a little fast.
CLOCK_SKEW = timedelta(minutes=5)


def when(value: Any, line: int, name: str, required: bool = False,
         past: bool = False) -> datetime | None:  # fmt: skip
    """An ISO 8601 time with its zone; None for null unless ``required``. ``past``: a
    time the service recorded, not in the future (beyond ``CLOCK_SKEW``): a fact recorded
    from 2099 was invisible to every ``as_of`` read, which may not be in the future."""
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise bad(line, f"{name} is not a time")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise bad(line, f"{name} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise bad(line, f"{name} has no time zone")
    if not storable(parsed):
        raise bad(line, f"{name} is not {RANGE}")
    if past and parsed > timezone.now() + CLOCK_SKEW:
        raise bad(line, f"{name} is in the future")
    return parsed


def text(obj: dict[str, Any], name: str, line: int, *, blank: bool = True, limit: int = 0) -> str:
    value = obj.get(name, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise bad(line, f"{name} is not a string")
    if not blank and not value.strip():
        raise bad(line, f"{name} is missing")
    if limit and len(value) > limit:
        raise bad(line, f"{name} is longer than {limit} characters")
    return value


def number(obj: dict[str, Any], name: str, line: int, default: Any = None) -> Any:
    value = obj.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(line, f"{name} is not a number")
    return value


def old_id(value: Any, line: int, name: str = "id") -> str:
    if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
        raise bad(line, f"{name} is missing")
    return str(value)


def embedding(obj: dict[str, Any], line: int) -> list[float] | None:
    value = obj.get("embedding")
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in value
    ):
        raise bad(line, "embedding is not a list of numbers")
    values = [float(x) for x in value]
    # Refused as a query vector is (a zero vector made every search over the data a 500:
    # its cosine distances are NaN).
    refused = vector_refusal(values)
    if refused:
        raise bad(line, f"embedding: {VECTOR_REFUSALS[refused]}")
    # One far from unit length is scaled to it (its cosines unchanged): the 16-bit copy
    # (halfvec) holds neither a component past 65504 (1e20: the indexer failed on it)
    # nor the squares of tiny ones (1e-10 each: zero there, NaN distances). An embedder's
    # vectors, about unit length already, are stored as the file has them.
    norm = math.sqrt(math.fsum(x * x for x in values))
    return values if abs(norm - 1.0) < UNIT_SLACK else [x / norm for x in values]


UNIT_SLACK = 0.01


@dataclass
class Ids:
    """The importing owner's ids for the file's: derived (``uuid5`` of the owner and the
    file's id), so the same file imported twice names the same objects, and another
    owner gets ids of its own. ``variant`` sets apart the rows of one id placed
    elsewhere (a fact in a scope the import's scope map renamed)."""

    owner_id: int
    known: dict[tuple[str, str], Any] = field(default_factory=dict)

    def new(self, kind: str, old: str, variant: str = "") -> uuid.UUID:
        name = f"memory-import:{self.owner_id}:{kind}"
        space = uuid.uuid5(uuid.NAMESPACE_URL, f"{name}:{variant}" if variant else name)
        return uuid.uuid5(space, str(old))

    def maybe(self, kind: str, old: str | None, variant: str = "") -> uuid.UUID | None:
        return None if old is None else self.new(kind, old, variant)
