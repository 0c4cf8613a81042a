"""Fields every API serializer shares: strict strings and booleans, query vectors."""

from __future__ import annotations

import json
import math
from typing import Any

from django.http import QueryDict
from rest_framework import serializers

# OpenAI's chat message roles: what the chat proxy and the memory APIs' messages take.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")

# The largest magnitude a pgvector (float4) component holds.
FLOAT4_MAX = 3.4028234663852886e38


class StrictCharField(serializers.CharField):
    """A JSON string is a string: ``123`` or ``1.5`` for a text field is refused (DRF's
    CharField turns numbers into their text, so a request the schema forbids was
    accepted: ``{"name": -2071580397144}`` made an API key named so). Query parameters
    are text anyway. Every API serializer uses this one (``tests/test_strict_fields.py``)."""

    default_error_messages = {"invalid": "Must be a string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# The largest ``metadata`` object a fact, a memory store item or a document takes, as
# JSON (UTF-8). Their text is capped; a 9 MB metadata was taken, then answered in every
# list and search (18 MB through MCP's search_memory, into a model's context).
MAX_METADATA_BYTES = 16_384


class MetadataField(serializers.DictField):
    """A JSON object of at most ``MAX_METADATA_BYTES`` (as JSON, UTF-8)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("default", dict)
        kwargs.setdefault("help_text", f"A JSON object of at most {MAX_METADATA_BYTES} bytes.")
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        refused = metadata_refusal(value)
        if refused:
            raise serializers.ValidationError(refused)
        return value


def metadata_refusal(value: Any) -> str | None:
    """Why ``value`` is too large a metadata object (None: it is not): the API's and
    an import's one check (an imported file took any size)."""
    size = len(json.dumps(value, ensure_ascii=False, default=str).encode())
    if size <= MAX_METADATA_BYTES:
        return None
    return (
        f"Ensure this object has no more than {MAX_METADATA_BYTES} bytes as JSON (it has {size})."
    )


# A boolean as text (a query parameter, a form field): these words, in any case.
QUERY_TRUE, QUERY_FALSE = ("true", "1"), ("false", "0")
QUERY_BOOLEAN = "true, false, 1 or 0"


def query_boolean(text: str) -> bool | None:
    """``text`` as a boolean (None: it is none of the words)."""
    word = text.strip().lower()
    return True if word in QUERY_TRUE else False if word in QUERY_FALSE else None


def _from_query(field: serializers.Field) -> bool:
    """Whether ``field`` reads text: query parameters, or a form or multipart body (a
    ``QueryDict`` either way), where ``"3"`` is how a number is written."""
    return isinstance(getattr(field.root, "initial_data", None), QueryDict)


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean is ``true`` or ``false``: the string ``"false"`` is refused (DRF's
    BooleanField reads it as False, and code that looked at the raw body saw a truthy
    string). Query parameters are text, so there ``true``/``false``/``1``/``0`` stay."""

    default_error_messages = {
        "invalid": "Must be a boolean (true or false).",
        "invalid_text": f"Must be {QUERY_BOOLEAN}.",
    }

    def to_internal_value(self, data: Any) -> bool:
        if isinstance(data, bool):
            return data
        if _from_query(self):  # (DRF's own took yes/no/on/off too: one set of words)
            read = query_boolean(str(data))
            if read is not None:
                return read
            self.fail("invalid_text")
        self.fail("invalid", input=data)
        raise AssertionError  # fail() raises


class StrictFloatField(serializers.FloatField):
    """A JSON number is a number: ``true`` (DRF's FloatField made it 1.0) and ``"0.9"``
    are refused. Query parameters are text, so there ``0.9`` is read as DRF reads it.
    Every API serializer uses this one (``tests/core/test_strict_fields.py``)."""

    default_error_messages = {"invalid": "Must be a number."}

    def to_internal_value(self, data: Any) -> float:
        if _from_query(self):
            return float(super().to_internal_value(data))
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return float(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    """A JSON whole number: ``"3"`` and ``true`` are refused; query parameters are read
    as DRF reads them. Every API serializer uses this one."""

    default_error_messages = {"invalid": "Must be a whole number."}

    def to_internal_value(self, data: Any) -> int:
        if _from_query(self):
            return int(super().to_internal_value(data))
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


# Why a vector cannot be searched by cosine (``vector_refusal``): the query field's
# messages and the import's.
VECTOR_REFUSALS = {
    "not_finite": "Vector components must be finite numbers of magnitude at most 3.4e38.",
    "zero": "The vector is all zeros: it has no direction to search by.",
}


def vector_refusal(values: list[float]) -> str | None:
    """The key in ``VECTOR_REFUSALS`` of what is wrong with ``values`` for cosine search,
    or None: a component float4 cannot hold, or no component at all but zeros (a zero
    vector has no direction: its cosine distances are NaN, which no JSON answer holds)."""
    if any(not math.isfinite(x) or abs(x) > FLOAT4_MAX for x in values):
        return "not_finite"
    if math.fsum(x * x for x in values) == 0.0:
        return "zero"
    return None


class QueryVectorField(serializers.ListField):
    """A query embedding for cosine search: finite floats a float4 column can hold, not
    all zero (``vector_refusal``). It is scaled to unit length, which leaves cosine
    distances unchanged and keeps pgvector's float4 sums of squares from overflowing
    (``[3e38, 3e38]``) or underflowing to 0."""

    child = StrictFloatField()
    default_error_messages = {**VECTOR_REFUSALS}

    def to_internal_value(self, data: Any) -> list[float]:
        values = super().to_internal_value(data)
        if refused := vector_refusal(values):
            self.fail(refused)
        norm = math.sqrt(math.fsum(x * x for x in values))
        return [x / norm for x in values]
