"""Every LLM answer the service reads goes through this one parser.

Models answer in many shapes: code fences, prose around the JSON, a ``<think>`` block
first, trailing commas or single quotes, JSON cut off at the token limit, the list
under another key (``facts``, ``memories``...), a bare list, one object where a list
was asked, strings for objects, numbers as strings, fields missing or extra, the
prompt's own example copied back. ``parse_json`` finds the JSON in an answer;
``read_answer`` reads it against a ``Shape`` (what the caller asked for) and says
what it found: ``ok``, ``empty`` (well formed, nothing in it) or ``malformed`` (with
the reason). ``complete_answer`` asks the model (with the response format the
provider takes, ``core.providers.response_format``), reads the answer, and asks once
more with the strict format when it could not be read. ``read_text`` does the same
for free-text answers (summaries).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import json_repair

from core.providers import response_format
from core.providers.errors import ProviderBadResponse
from core.providers.llm import ChatLLM, ChatResult

logger = logging.getLogger(__name__)

EXCERPT_CHARS = 500
REPAIR_PROMPT = (
    "Your previous answer was not valid JSON. Answer again with only the JSON object, "
    "no prose, no code fences."
)
_THINK_TAGS = "think|thinking|reasoning"
_THINK_BLOCK = re.compile(rf"<({_THINK_TAGS})>.*?</\1>", re.S | re.I)
_THINK_CLOSE = re.compile(rf"</(?:{_THINK_TAGS})>", re.I)
_THINK_OPEN = re.compile(rf"<(?:{_THINK_TAGS})>", re.I)
_FENCE = re.compile(r"```[\w+-]*[ \t]*\n?(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"^```[\w+-]*[ \t]*\n?")
_REFUSAL = re.compile(
    r"^\W*(i'?m sorry|i am sorry|sorry|i can'?t|i cannot|i can not|i'?m unable|i am unable|"
    r"i won'?t|i will not|as an ai|unfortunately,? i)\b",
    re.I,
)
MAX_OPENINGS = 64  # where JSON may start in an answer: enough for any prose before it
GENERIC_PLACEHOLDERS = frozenset(
    {"n/a", "na", "none", "null", "nil", "todo", "tbd", "example", "string", "text", "fact",
     "content", "placeholder", "your fact here", "fact here", "lorem ipsum", "sentence"}
)  # fmt: skip
CONFIDENCE_WORDS = {"very high": 0.95, "high": 0.9, "medium": 0.75, "moderate": 0.75, "low": 0.5}


# --- finding the JSON ---------------------------------------------------------------
def strip_thinking(text: str) -> str:
    """The answer without a reasoning model's ``<think>`` blocks (also ``<thinking>``,
    ``<reasoning>``): closed ones go; a closing tag without its opening (servers that
    drop it) leaves what follows it; an opening tag never closed (cut off while
    thinking) leaves what precedes it."""
    text = _THINK_BLOCK.sub("", text or "")
    closings = list(_THINK_CLOSE.finditer(text))
    if closings:
        text = text[closings[-1].end() :]
    opening = _THINK_OPEN.search(text)
    if opening:
        text = text[: opening.start()]
    return text.strip()


@dataclass
class Parsed:
    """The JSON found in an answer: its first value, the values that follow it (JSON
    Lines), and how it was found (``notes``); ``truncated`` when it was cut off."""

    value: Any
    more: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    truncated: bool = False


def parse_json(text: str) -> Parsed | None:
    """The JSON in an answer, or None. Tried in order: the answer as it is, the inside
    of its code fences, JSON cut off at the token limit (cut back to its last complete
    element and closed), the longest JSON value found after prose, then a repair
    (trailing commas, single quotes, unquoted keys, comments)."""
    body = strip_thinking(text)
    candidates = [m.group(1) for m in _FENCE.finditer(body)]
    if body.lstrip().startswith("```") and body.count("```") == 1:  # a fence never closed
        candidates.append(_OPEN_FENCE.sub("", body.lstrip()))
    candidates.append(body)
    for candidate in candidates:
        parsed = _decode(candidate.strip())
        if parsed is not None:
            if candidate is not body:
                parsed.notes.insert(0, "in a code fence")
            return parsed
    return None


def _decode(text: str) -> Parsed | None:
    if not text:
        return None
    try:
        return Parsed(json.loads(text))
    except ValueError:
        pass
    openings = [m.start() for m in re.finditer(r"[\[{]", text)][:MAX_OPENINGS]
    if not openings:
        return None
    cut = _truncation_cut(text, openings[0])
    if cut is not None:
        value = _repaired(cut)
        if value is not None:
            return Parsed(value, notes=["truncated: cut back to its last complete element"],
                          truncated=True)  # fmt: skip
    found = _longest_value(text, openings)
    if found is not None:
        return found
    value = _repaired(text[openings[0] :])
    return Parsed(value, notes=["repaired"]) if value is not None else None


def _longest_value(text: str, openings: list[int]) -> Parsed | None:
    """The longest JSON value starting at one of ``openings`` (then the values right
    after it, JSON Lines); trailing commas forgiven."""
    best: tuple[int, Parsed] | None = None
    decoder = json.JSONDecoder()
    for variant in (text, re.sub(r",\s*([}\]])", r"\1", text)):
        for start in _openings_of(variant, openings, text):
            try:
                value, end = decoder.raw_decode(variant, start)
            except ValueError:
                continue
            if best is None or end - start > best[0]:
                more, _ = _following(variant, end)
                notes = ["prose around it"] if start or variant[end:].strip() else []
                best = (end - start, Parsed(value, more, notes))
        if best is not None:
            return best[1]
    return None


def _openings_of(variant: str, openings: list[int], original: str) -> list[int]:
    if variant is original:
        return openings
    return [m.start() for m in re.finditer(r"[\[{]", variant)][:MAX_OPENINGS]


def _following(text: str, end: int) -> tuple[list[Any], int]:
    """JSON values right after ``end``, separated by whitespace or commas only."""
    decoder, values = json.JSONDecoder(), list[Any]()
    while True:
        match = re.compile(r"[\s,]*").match(text, end)
        start = match.end() if match else end
        if start >= len(text) or text[start] not in "[{":
            return values, end
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            return values, end
        values.append(value)


def _truncation_cut(text: str, start: int) -> str | None:
    """When the JSON value at ``start`` is never closed (the answer was cut off), the
    text up to its last complete element (a closed object or list, or a string in a
    list); None when the value closes."""
    stack: list[str] = []
    in_string = escaped = False
    last = start + 1
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if stack and stack[-1] == "[":
                    last = index + 1
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            stack.append(char)
            last = index + 1
        elif char in "]}":
            if stack:
                stack.pop()
            if not stack:
                return None  # the value closed: not cut off
            last = index + 1
    return text[start:last]


def _repaired(text: str) -> Any:
    try:
        value = json_repair.repair_json(text, return_objects=True, skip_json_loads=True)
    except Exception:  # noqa: BLE001 - a repair that fails is no JSON
        return None
    return value if isinstance(value, dict | list) else None


def parse_json_object(text: str, *, list_key: str) -> dict[str, Any] | None:
    """The first JSON object of an answer (``parse_json``); a bare list is taken as
    ``{list_key: list}``; None when there is neither."""
    parsed = parse_json(text or "")
    if parsed is None:
        return None
    if isinstance(parsed.value, list):
        return {list_key: parsed.value}
    return parsed.value if isinstance(parsed.value, dict) else None


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """A tool call's arguments: an object as it came, or the JSON object in its text
    (``parse_json``); no text is no arguments (``{}``); None when it holds no object."""
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not strip_thinking(raw)):
        return {}
    parsed = parse_json(str(raw))
    return parsed.value if parsed is not None and isinstance(parsed.value, dict) else None


# --- what the caller asked for ------------------------------------------------------
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


def _no_json_reason(text: str) -> str:
    body = strip_thinking(text)
    if not (text or "").strip():
        return "the answer is empty"
    if not body:
        return "the answer holds only a <think> block, no answer after it"
    if _REFUSAL.match(body):
        return f"the model declined: {body.splitlines()[0][:200]}"
    return "no JSON in the answer"


def read_answer(text: str, shape: Shape, *, source: str = "", truncated: bool = False) -> Reading:
    """Read ``text`` as an answer of ``shape`` (see ``Reading``). ``source``: what the
    model read (the prompt's example texts count as content only when it says them);
    ``truncated``: the provider said the answer was cut off (``finish_reason: length``)."""
    parsed = parse_json(text)
    if parsed is None:
        return Reading("malformed", reason=_no_json_reason(text), answer=text or "")
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


# --- free text ----------------------------------------------------------------------
@dataclass
class TextReading:
    text: str
    reason: str = ""
    answer: str = ""

    @property
    def malformed(self) -> bool:
        return bool(self.reason)


def read_text(text: str) -> TextReading:
    """A free-text answer (a summary): without its ``<think>`` blocks and a code fence
    around it all; malformed when nothing is left or it is a refusal."""
    body = strip_thinking(text)
    fenced = re.fullmatch(r"```[\w+-]*[ \t]*\n?(.*?)```", body, re.S)
    if fenced:
        body = fenced.group(1).strip()
    if not body or (len(body) < 300 and _REFUSAL.match(body)):
        return TextReading("", _no_json_reason(text).replace("no JSON in", "nothing in"), text)
    return TextReading(body, answer=text)


class MalformedAnswer(ProviderBadResponse):
    """An LLM answer that could not be read, even asked again: the reason and the first
    500 characters of the answer are in ``details``."""

    code = "llm_answer_malformed"

    def __init__(self, what: str, reason: str, answer: str):
        self.reason, self.answer = reason, answer
        super().__init__(
            f"the model's {what} answer could not be read: {reason}",
            details={"reason": reason, "answer": answer[:EXCERPT_CHARS]},
        )


# --- asking -------------------------------------------------------------------------
@dataclass
class Answer:
    """The reading of the last answer and the completions it took."""

    reading: Reading
    results: list[ChatResult] = field(default_factory=list)


def repair_prompt(shape: Shape, reason: str) -> str:
    return (
        f"Your previous answer was not valid JSON in the expected shape ({reason}). "
        f"Answer again with only the JSON object, no prose, no code fences, like: {shape.example}"
    )


def complete_answer(
    llm: ChatLLM,
    messages: list[dict[str, str]],
    *,
    shape: Shape,
    what: str,
    source: str = "",
    event: str = "llm_malformed_answer",
    log: logging.Logger = logger,
    **kwargs: Any,
) -> Answer:
    """One completion (``kwargs`` passed on: model, temperature, ...) asked in the
    response format the provider takes (``response_format``) and read as ``shape``
    (``read_answer``). An answer that cannot be read is logged at warning as ``event``
    on ``log`` and asked again once, with the model's own answer, the reason and the
    strict format. Provider errors are raised (``ProviderError``)."""
    model = str(kwargs.get("model") or llm.model)
    schema = {"name": shape.name, "schema": json_schema(shape)}
    fmt = response_format.first_format(llm, model)
    answer = Answer(Reading("malformed"))
    for attempt in range(2):
        result = response_format.complete(llm, messages, schema=schema, fmt=fmt, **kwargs)
        answer.results.append(result)
        text = result.content or result.refusal
        answer.reading = read_answer(text, shape, source=source,
                                     truncated=result.finish_reason == "length")  # fmt: skip
        if not answer.reading.malformed:
            return answer
        log.warning(json.dumps({"event": event, "what": what, "attempt": attempt + 1,
                                "reason": answer.reading.reason, "answer": text[:EXCERPT_CHARS]},
                               ensure_ascii=False))  # fmt: skip
        messages = [
            *messages,
            {"role": "assistant", "content": text},
            {"role": "user", "content": repair_prompt(shape, answer.reading.reason)},
        ]
        fmt = response_format.strict_format(llm, model)
    return answer


@dataclass
class JsonAnswer:
    """The parsed object (None when neither answer parsed) and the completions it took."""

    value: dict[str, Any] | None
    results: list[ChatResult] = field(default_factory=list)


def complete_json(
    llm: ChatLLM,
    messages: list[dict[str, str]],
    *,
    list_key: str,
    what: str,
    event: str = "llm_malformed_json",
    log: logging.Logger = logger,
    **kwargs: Any,
) -> JsonAnswer:
    """One completion parsed as a JSON object of no particular shape
    (``parse_json_object``), asked again once with ``REPAIR_PROMPT`` when none is
    found. Callers that know their answer's shape use ``complete_answer``."""
    answer = JsonAnswer(None)
    for attempt in range(2):
        result = llm.complete(messages, **kwargs)
        answer.results.append(result)
        answer.value = parse_json_object(result.content, list_key=list_key)
        if answer.value is not None:
            return answer
        log.warning(json.dumps({"event": event, "what": what, "attempt": attempt + 1,
                                "answer": result.content[:EXCERPT_CHARS]}))  # fmt: skip
        messages = [
            *messages,
            {"role": "assistant", "content": result.content},
            {"role": "user", "content": REPAIR_PROMPT},
        ]
    return answer
