"""Request bodies the database can store, checked once for the whole API.

PostgreSQL's ``text`` and ``jsonb`` cannot hold a NUL character (``\\u0000``), and a lone
UTF-16 surrogate (``"\\ud800"``, valid JSON) cannot be encoded as UTF-8: either one used
to reach a query or an upstream call and end in a 500 (or a 502 blaming the LLM); nor can
a JSON number too large for a float (``1e999`` parses as infinity; jsonb refuses it).
Deeply nested JSON made ``json`` or a later serializer raise ``RecursionError``. Every
parser of the API (JSON, forms, the stores' YAML) hands its result to
``check_parsed``, which refuses them with a 400 naming the first offending
field, before a view sees the data.
"""

from __future__ import annotations

import math
import re
from typing import Any

from django.conf import settings
from django.utils.datastructures import MultiValueDict
from rest_framework import exceptions, parsers

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


class UnstorableInput(exceptions.ValidationError):
    """A 400 in the project's error shape; ``details`` names the field (``a.b[2]``)."""


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _text_problem(text: str) -> str | None:
    found = _BAD_TEXT.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "NUL characters (\\u0000) are not allowed in text."
    return "Lone UTF-16 surrogates (\\ud800-\\udfff) are not allowed in text."


def _refuse(path: str, message: str) -> None:
    raise UnstorableInput({path or "body": [message]})


def unstorable_message(exc: UnstorableInput) -> str:
    """``exc``'s first problem as ``<field>: <message>`` (the doors that answer in a
    shape of their own: an import's line, an MCP tool's error)."""
    problems: dict[str, Any] = dict(exc.detail)  # type: ignore[arg-type]
    field, messages = next(iter(problems.items()))
    return f"{field}: {messages[0]}"


def check_parsed(data: Any, *, max_depth: int | None = None) -> Any:
    """Return ``data`` unchanged, or raise a 400 for the first string (key or value)
    with a NUL or a lone surrogate, or nesting deeper than ``max_depth``
    (``API_MAX_JSON_DEPTH``). Iterative: a hostile depth cannot exhaust the stack."""
    limit = settings.API_MAX_JSON_DEPTH if max_depth is None else max_depth
    if isinstance(data, MultiValueDict):
        data = {key: values for key, values in data.lists()}
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem:
                _refuse(path, problem)
        elif isinstance(value, float) and not math.isfinite(value):  # 1e999 parses as inf
            said = "NaN is no number" if math.isnan(value) else "1e999 and .inf are out of range"
            _refuse(path, f"Numbers must be finite ({said}).")
        elif isinstance(value, dict | list):
            if depth >= limit:
                _refuse(path, f"JSON may be nested at most {limit} levels deep.")
            if isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(key, str):
                        problem = _text_problem(key)
                        if problem:
                            _refuse(_join(path, "<key>"), problem + f" (key {key!r:.40})")
                    stack.append((item, _join(path, key), depth + 1))
            else:
                stack.extend((item, _join(path, i), depth + 1) for i, item in enumerate(value))
    return data


def too_deep() -> UnstorableInput:
    return UnstorableInput(
        {"body": [f"JSON may be nested at most {settings.API_MAX_JSON_DEPTH} levels deep."]}
    )


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # json's C scanner gives up near the interpreter's limit
            raise too_deep() from None
        return check_parsed(data)


class FormParser(parsers.FormParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        check_parsed(data)
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        parsed = super().parse(stream, media_type, parser_context)
        check_parsed(parsed.data)
        return parsed
