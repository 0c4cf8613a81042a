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

from core.providers.json_answer.ask import (
    REPAIR_PROMPT,
    Answer,
    JsonAnswer,
    MalformedAnswer,
    TextReading,
    complete_answer,
    complete_json,
    read_text,
    repair_prompt,
)
from core.providers.json_answer.parse import (
    Parsed,
    parse_arguments,
    parse_json,
    parse_json_object,
    strip_thinking,
)
from core.providers.json_answer.shapes import (
    EXCERPT_CHARS,
    Field,
    ListSpec,
    Reading,
    Shape,
    json_schema,
    read_answer,
)

__all__ = [
    "EXCERPT_CHARS", "REPAIR_PROMPT", "Answer", "Field", "JsonAnswer", "ListSpec",
    "MalformedAnswer", "Parsed", "Reading", "Shape", "TextReading", "complete_answer",
    "complete_json", "json_schema", "parse_arguments", "parse_json", "parse_json_object",
    "read_answer", "read_text", "repair_prompt", "strip_thinking",
]  # fmt: skip
