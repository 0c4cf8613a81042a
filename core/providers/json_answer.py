"""LLM answers that must be JSON: best-effort repair, then one more ask.

Small models wrap their JSON in code fences, prose or trailing commas; the repair
takes those off. When nothing parses, the model is shown its answer and asked once
more for the JSON alone. What still does not parse is ``None``, never an exception:
every caller has a fallback (memory formation skips, query rewriting searches as
asked).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from core.providers.llm import ChatLLM, ChatResult

logger = logging.getLogger(__name__)

REPAIR_PROMPT = (
    "Your previous answer was not valid JSON. Answer again with only the JSON object, "
    "no prose, no code fences."
)


def parse_json_object(text: str, *, list_key: str) -> dict[str, Any] | None:
    """Best-effort JSON repair: code fences, prose around the object, trailing commas,
    more text after the first object. A bare JSON list is taken as ``{list_key: list}``."""
    if not text:
        return None
    candidate = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip(), flags=re.IGNORECASE)
    attempts = (
        candidate,
        _outermost(candidate, "{", "}"),
        _first_object(candidate),
        _outermost(candidate, "[", "]"),
    )
    for attempt in attempts:
        if not attempt:
            continue
        for variant in (attempt, re.sub(r",\s*([}\]])", r"\1", attempt)):
            try:
                value = json.loads(variant)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
            if isinstance(value, list):
                return {list_key: value}
    return None


def _first_object(text: str) -> str | None:
    """The first complete JSON object of ``text``: a model that goes on writing after its
    answer (another object, a repeat, prose) leaves the outermost braces unparseable."""
    start = text.find("{")
    if start == -1:
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None
    return text[start:end]


def _outermost(text: str, opening: str, closing: str) -> str | None:
    start, end = text.find(opening), text.rfind(closing)
    return text[start : end + 1] if start != -1 and end > start else None


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
    """One completion (``kwargs`` passed on: model, temperature, ...) parsed as a JSON
    object; a malformed answer is repaired, or asked again once with the model's own
    answer and ``REPAIR_PROMPT``, each malformed answer logged as ``event`` on ``log``.
    Provider errors are raised (``ProviderError``)."""
    answer = JsonAnswer(None)
    for attempt in range(2):
        result = llm.complete(messages, **kwargs)
        answer.results.append(result)
        answer.value = parse_json_object(result.content, list_key=list_key)
        if answer.value is not None:
            return answer
        log.warning(
            json.dumps(
                {
                    "event": event,
                    "what": what,
                    "attempt": attempt + 1,
                    "answer": result.content[:500],
                }
            )
        )
        messages = [
            *messages,
            {"role": "assistant", "content": result.content},
            {"role": "user", "content": REPAIR_PROMPT},
        ]
    return answer
