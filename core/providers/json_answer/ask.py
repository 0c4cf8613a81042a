"""Asking for an answer and reading it: structured (``complete_answer``), free text
(``read_text``), and the shapeless JSON object of older callers (``complete_json``)."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from core.providers import response_format
from core.providers.errors import ProviderBadResponse
from core.providers.json_answer.parse import REFUSAL, parse_json_object, strip_thinking
from core.providers.json_answer.shapes import (
    EXCERPT_CHARS,
    Reading,
    Shape,
    json_schema,
    no_json_reason,
    read_answer,
)
from core.providers.llm import ChatLLM, ChatResult

logger = logging.getLogger("core.providers.json_answer")
REPAIR_PROMPT = (
    "Your previous answer was not valid JSON. Answer again with only the JSON object, "
    "no prose, no code fences."
)


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
    body = _text_in_json(body)
    if not body or (len(body) < 300 and REFUSAL.match(body)):
        return TextReading("", no_json_reason(text).replace("no JSON in", "nothing in"), text)
    return TextReading(body, answer=text)


TEXT_KEYS = ("summary", "text", "content", "answer", "result")


def _text_in_json(body: str) -> str:
    """A model that answers free text as a JSON object (``{"summary": "..."}``): the
    text under its first text key; anything else as it is."""
    if not body.startswith("{"):
        return body
    parsed = parse_json_object(body, list_key="_")
    if parsed is None:
        return body
    keys = {str(k).casefold(): v for k, v in parsed.items()}
    found = next((keys[k] for k in TEXT_KEYS if isinstance(keys.get(k), str)), None)
    return found.strip() if found else body


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
