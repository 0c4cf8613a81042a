"""Reading an answer against what the caller asked for (a ``Shape``): the documented
keys and the variants models write, coerced, placeholders left out; ``ok``, ``empty``
or ``malformed`` with the reason."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.providers.json_answer.parse import REFUSAL, Parsed, parse_json, strip_thinking

EXCERPT_CHARS = 500
GENERIC_PLACEHOLDERS = frozenset(
    {"n/a", "na", "none", "null", "nil", "todo", "tbd", "example", "string", "text", "fact",
     "content", "placeholder", "your fact here", "fact here", "lorem ipsum", "sentence"}
)  # fmt: skip
CONFIDENCE_WORDS = {"very high": 0.95, "high": 0.9, "medium": 0.75, "moderate": 0.75, "low": 0.5}


@dataclass(frozen=True)
class Field:
    """One field of an item. ``kind``: ``text``, ``number`` (0 to 1: a confidence),
    ``choice`` (one of ``choices``; ``synonyms`` map others in, anything else is
    ``default``), ``ref`` (an id or null) or ``texts`` (a list of strings)."""

    name: str
    kind: str = "text"
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    synonyms: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None


@dataclass(frozen=True)
class ListSpec:
    """A list in the answer: its documented ``key`` and the keys models use instead.
    With ``fields``, its items are objects whose text is the ``text`` field (a bare
    string item is that text); without, its items are strings (an object item gives
    the value of its first ``text_keys`` key)."""

    key: str
    aliases: tuple[str, ...] = ()
    fields: tuple[Field, ...] = ()
    text: str = "content"
    text_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shape:
    """What one kind of answer holds: its lists (the first is the main one: a bare list,
    or one object, is taken for it), its top-level text fields, the example shown to
    the model when it is asked again, and texts that are never content: placeholders
    (a bare category name, the example's ``...``) and ``examples``, the prompt's own
    example texts (each with a word: the example is a placeholder unless that word is
    in the source the model read)."""

    name: str
    lists: tuple[ListSpec, ...]
    example: str
    texts: tuple[Field, ...] = ()
    placeholders: frozenset[str] = frozenset()
    examples: tuple[tuple[str, str], ...] = ()


def json_schema(shape: Shape) -> dict[str, Any]:
    """The JSON Schema of the documented shape (strict: every field required, nothing
    else), for ``response_format``."""
    properties: dict[str, Any] = {}
    for spec in shape.lists:
        item: dict[str, Any] = {"type": "string"}
        if spec.fields:
            fields = {f.name: _field_schema(f) for f in spec.fields}
            item = {"type": "object", "properties": fields, "required": list(fields),
                    "additionalProperties": False}  # fmt: skip
        properties[spec.key] = {"type": "array", "items": item}
    for text in shape.texts:
        properties[text.name] = {"type": "string"}
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}  # fmt: skip


def _field_schema(spec: Field) -> dict[str, Any]:
    if spec.kind == "number":
        return {"type": "number"}
    if spec.kind == "choice":
        return {"type": "string", "enum": list(spec.choices)}
    if spec.kind == "ref":
        return {"type": ["string", "null"]}
    if spec.kind == "texts":
        return {"type": "array", "items": {"type": "string"}}
    return {"type": "string"}


# --- reading it ---------------------------------------------------------------------
@dataclass
class Reading:
    """An answer read against its shape. ``status``: ``ok``, ``empty`` (well formed,
    nothing in it: nothing to learn) or ``malformed`` (``reason`` says why). ``value``
    has the shape's keys: each list's items (objects with the fields found, coerced;
    strings for a list of strings) and each text field. ``missing`` counts, per field,
    the items without it; ``notes`` say which variants were read."""

    status: str
    value: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    answer: str = ""
    notes: list[str] = field(default_factory=list)
    missing: dict[str, int] = field(default_factory=dict)

    @property
    def malformed(self) -> bool:
        return self.status == "malformed"

    @property
    def excerpt(self) -> str:
        return self.answer[:EXCERPT_CHARS]


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).casefold())


def no_json_reason(text: str) -> str:
    body = strip_thinking(text)
    if not (text or "").strip():
        return "the answer is empty"
    if not body:
        return "the answer holds only a <think> block, no answer after it"
    if REFUSAL.match(body):
        return f"the model declined: {body.splitlines()[0][:200]}"
    return "no JSON in the answer"


def read_answer(text: str, shape: Shape, *, source: str = "", truncated: bool = False) -> Reading:
    """Read ``text`` as an answer of ``shape`` (see ``Reading``). ``source``: what the
    model read (the prompt's example texts count as content only when it says them);
    ``truncated``: the provider said the answer was cut off (``finish_reason: length``)."""
    parsed = parse_json(text)
    if parsed is None:
        return Reading("malformed", reason=no_json_reason(text), answer=text or "")
    reader = _Reader(shape, source, text or "", parsed)
    return reader.read(truncated or parsed.truncated)


class _Reader:
    def __init__(self, shape: Shape, source: str, answer: str, parsed: Parsed):
        self.shape, self.answer, self.parsed = shape, answer, parsed
        self.notes = list(parsed.notes)
        self.missing: dict[str, int] = {}
        lowered = source.casefold()
        self.placeholders = {_key(p) for p in shape.placeholders} | {
            _key(text) for text, word in shape.examples if word.casefold() not in lowered
        }
        self.seen = self.dropped = 0

    def read(self, truncated: bool) -> Reading:
        top = self._top()
        if top is None:
            return self._malformed(self._no_list_reason())
        value: dict[str, Any] = {}
        found = False
        for index, spec in enumerate(self.shape.lists):
            raw, present = self._list_in(top, spec, main=index == 0)
            found = found or present
            value[spec.key] = self._items(raw, spec)
        if not found:
            return self._malformed(self._no_list_reason())
        for text in self.shape.texts:
            value[text.name] = self._text_field(top, text)
        items = sum(len(value[spec.key]) for spec in self.shape.lists)
        if self.seen and not items:
            return self._malformed(
                f"none of its {self.seen} items could be read (placeholders such as "
                '"..." or the example\'s own text, or no text)'
            )
        if truncated and not items:
            return self._malformed("the answer was cut off before its first complete item")
        if self.dropped:
            self.notes.append(f"{self.dropped} unreadable or placeholder items left out")
        status = "ok" if items else "empty"
        return Reading(status, value, answer=self.answer, notes=self.notes, missing=self.missing)

    def _malformed(self, reason: str) -> Reading:
        return Reading("malformed", reason=reason, answer=self.answer, notes=self.notes)

    def _no_list_reason(self) -> str:
        value = self.parsed.value
        wanted = f'a "{self.shape.lists[0].key}" list'
        if isinstance(value, dict):
            keys = ", ".join(sorted(map(str, value))[:8]) or "none"
            return f"valid JSON without {wanted} (its keys: {keys})"
        return f"valid JSON ({type(value).__name__}) without {wanted}"

    # where the lists are
    def _top(self) -> dict[str, Any] | None:
        """The answer as an object of the shape: a bare list (or JSON Lines of items)
        is the main list; answer objects given one after another are merged."""
        values = [self.parsed.value, *self.parsed.more]
        main = self.shape.lists[0]
        if all(isinstance(v, dict) and self._has_list(v) for v in values):
            if len(values) > 1:
                self.notes.append("answer objects one after another: merged")
            return self._merged(values)
        if isinstance(self.parsed.value, list):
            listed = self.parsed.value
            if listed and all(isinstance(v, dict) and self._has_list(v) for v in listed):
                self.notes.append("a list of answer objects: merged")
                return self._merged(listed)
            self.notes.append("a bare list")
            return {main.key: listed + self.parsed.more}
        if isinstance(self.parsed.value, dict):
            if len(values) > 1:
                self.notes.append("objects one after another (JSON Lines)")
                return {main.key: values}
            return self.parsed.value
        if isinstance(self.parsed.value, str) and self.parsed.value.strip():
            return {main.key: [self.parsed.value]}
        return None

    def _has_list(self, value: dict[str, Any]) -> bool:
        keys = {_key(k) for k in value}
        return any(
            _key(name) in keys for spec in self.shape.lists for name in (spec.key, *spec.aliases)
        )

    def _merged(self, values: list[dict[str, Any]]) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for value in values:
            for key, item in value.items():
                if isinstance(item, list) and isinstance(merged.get(key), list):
                    merged[key] = merged[key] + item
                else:
                    merged.setdefault(key, item)
        return merged

    def _list_in(self, top: dict[str, Any], spec: ListSpec, *, main: bool) -> tuple[Any, bool]:
        """The raw list for ``spec`` and whether the answer has it (under its key, a
        known other key, one object deeper; for the main list also the one list of an
        object with no known key, or the object itself when it is one item)."""
        by_key = {_key(k): v for k, v in top.items()}
        for name in (spec.key, *spec.aliases):
            if _key(name) in by_key:
                if name != spec.key:
                    self.notes.append(f'"{spec.key}" read from "{name}"')
                return by_key[_key(name)], True
        if not main:
            return [], False
        for key, inner in top.items():
            if isinstance(inner, dict) and self._has_list(inner):
                self.notes.append(f'the lists read inside "{key}"')
                return self._list_in(inner, spec, main=True)
        if self._is_item(top, spec):
            self.notes.append("one object for the list")
            return [top], True
        lists = [(k, v) for k, v in top.items() if isinstance(v, list)]
        if len(lists) == 1 and not self._has_list(top):
            self.notes.append(f'"{spec.key}" read from "{lists[0][0]}"')
            return lists[0][1], True
        return [], False

    def _is_item(self, value: dict[str, Any], spec: ListSpec) -> bool:
        if not spec.fields:
            return any(_key(k) in {_key(t) for t in spec.text_keys} for k in value)
        text = next(f for f in spec.fields if f.name == spec.text)
        return any(_key(k) in {_key(n) for n in (text.name, *text.aliases)} for k in value)

    # the items
    def _items(self, raw: Any, spec: ListSpec) -> list[Any]:
        if raw is None:
            return []
        if isinstance(raw, dict | str | int | float) and not isinstance(raw, bool):
            self.notes.append(f'"{spec.key}" was one {type(raw).__name__}, not a list')
            raw = [raw]
        if not isinstance(raw, list):
            return []
        items = []
        for item in raw:
            self.seen += 1
            read = self._object(item, spec) if spec.fields else self._string(item, spec)
            if read is None:
                self.dropped += 1
            else:
                items.append(read)
        return items

    def _string(self, item: Any, spec: ListSpec) -> str | None:
        if isinstance(item, dict):
            keys = {_key(k): v for k, v in item.items()}
            item = next((keys[_key(t)] for t in spec.text_keys if _key(t) in keys), None)
        if isinstance(item, int | float) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str):
            return None
        text = " ".join(item.split())
        return None if self._placeholder(text) else text

    def _object(self, item: Any, spec: ListSpec) -> dict[str, Any] | None:
        if isinstance(item, str):
            item = {spec.text: item}
        if not isinstance(item, dict):
            return None
        keys = {_key(k): v for k, v in item.items()}
        out: dict[str, Any] = {}
        for spec_field in spec.fields:
            names = (spec_field.name, *spec_field.aliases)
            raw = next((keys[_key(n)] for n in names if _key(n) in keys), None)
            value = _coerce(spec_field, raw)
            if value is None:
                self.missing[spec_field.name] = self.missing.get(spec_field.name, 0) + 1
            else:
                out[spec_field.name] = value
        text = out.get(spec.text)
        if not isinstance(text, str) or self._placeholder(text):
            return None
        return out

    def _placeholder(self, text: str) -> bool:
        key = _key(text)
        return (
            not key
            or key in self.placeholders
            or text.casefold().strip(" .!?\"'") in GENERIC_PLACEHOLDERS
            or bool(re.fullmatch(r"<[^<>]*>|\[[^\[\]]*\]|\{[^{}]*\}", text.strip()))
        )

    def _text_field(self, top: dict[str, Any], spec: Field) -> str:
        keys = {_key(k): v for k, v in top.items()}
        raw = next((keys[_key(n)] for n in (spec.name, *spec.aliases) if _key(n) in keys), None)
        return raw.strip() if isinstance(raw, str) else ""


def _coerce(spec: Field, raw: Any) -> Any:
    """A field's value as its kind wants it, or None (missing or unreadable)."""
    if raw is None or isinstance(raw, bool):
        return None
    if spec.kind == "number":
        return _number(raw)
    if spec.kind == "texts":
        items = raw if isinstance(raw, list) else [raw]
        return [str(i).strip() for i in items if isinstance(i, str | int) and str(i).strip()]
    if isinstance(raw, int | float):
        raw = str(raw)
    if not isinstance(raw, str):
        return None
    text = " ".join(raw.split())
    if spec.kind == "choice":
        return _choice(spec, text)
    if spec.kind == "ref":
        return None if _key(text) in {"", "null", "none", "nil", "na"} else text
    return text or None


def _number(raw: Any) -> float | None:
    """A confidence from 0 to 1: a number, a number as a string, a percentage
    (``"85%"``, or ``85``), or a word (high 0.9, medium 0.75, low 0.5)."""
    if isinstance(raw, str):
        text = raw.strip().casefold()
        if text in CONFIDENCE_WORDS:
            return CONFIDENCE_WORDS[text]
        percent = text.endswith("%")
        try:
            number = float(text.rstrip("%").strip())
        except ValueError:
            return None
        if percent:
            number /= 100
    elif isinstance(raw, int | float):
        number = float(raw)
    else:
        return None
    if number != number or number < 0:  # NaN, negative
        return None
    if 1 < number <= 100:
        number /= 100
    return number if number <= 1 else None


def _choice(spec: Field, text: str) -> str | None:
    wanted = text.casefold()
    for candidate in (wanted, wanted.rstrip("s"), _key(wanted)):
        if candidate in spec.choices:
            return candidate
        if candidate in spec.synonyms:
            return spec.synonyms[candidate]
    return spec.default
