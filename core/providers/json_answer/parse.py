"""Finding the JSON in an LLM answer: ``<think>`` blocks, code fences, prose around it,
JSON Lines, trailing commas, single quotes, JSON cut off at the token limit."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import json_repair

_THINK_TAGS = "think|thinking|reasoning"
_THINK_BLOCK = re.compile(rf"<({_THINK_TAGS})>.*?</\1>", re.S | re.I)
_THINK_CLOSE = re.compile(rf"</(?:{_THINK_TAGS})>", re.I)
_THINK_OPEN = re.compile(rf"<(?:{_THINK_TAGS})>", re.I)
_FENCE = re.compile(r"```[\w+-]*[ \t]*\n?(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"^```[\w+-]*[ \t]*\n?")
REFUSAL = re.compile(
    r"^\W*(i'?m sorry|i am sorry|sorry|i can'?t|i cannot|i can not|i'?m unable|i am unable|"
    r"i won'?t|i will not|as an ai|unfortunately,? i)\b",
    re.I,
)
MAX_OPENINGS = 64  # where JSON may start in an answer: enough for any prose before it


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
    text up to its last complete element (a closed object or list, a string in a list,
    a string value in an object); None when the value closes."""
    stack: list[str] = []
    in_string = escaped = value_next = False
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
                if stack and (stack[-1] == "[" or value_next):
                    last, value_next = index + 1, False
            continue
        if char == '"':
            in_string = True
        elif char == ":":
            value_next = True
        elif char == ",":
            value_next = False
        elif char in "[{":
            stack.append(char)
            last, value_next = index + 1, False
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
    if parsed is None or not isinstance(parsed.value, dict):
        return None
    if parsed.truncated and not parsed.value and strip_thinking(str(raw)).strip() != "{":
        return None  # ("{not json" cut back to "{}": nothing of what was sent is in it)
    return parsed.value
