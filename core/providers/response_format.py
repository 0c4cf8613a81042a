"""How the service asks for structure: ``response_format`` on the calls that expect JSON.

``LLM_RESPONSE_FORMAT`` names the first format tried: ``json_schema`` (the answer's
JSON Schema, strict: OpenAI, OpenRouter, Ollama, vLLM, LM Studio, llama.cpp's server
take it), ``json_object`` (any JSON object), ``none`` (the prompt alone) or ``auto``
(the default): ``json_object`` for the providers known to take only that
(``JSON_OBJECT_HOSTS``), ``json_schema`` for every other ``LLM_BASE_URL``.

An upstream that refuses the field (a 400 or 422 to a request carrying it, whose
message names it: ``response_format``, ``json_schema``, "schema", "format"...; every
server we know of says so) is asked again at once with the next weaker format, down
to none; the format that worked is
remembered for that endpoint and model for the life of the process, so the refusal
costs one extra call, once.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from core.providers.errors import ProviderError
from core.providers.llm import ChatLLM, ChatResult

logger = logging.getLogger(__name__)

FORMATS = ("json_schema", "json_object", "none")  # strictest first
SETTINGS = ("auto", *FORMATS)
REFUSED_STATUSES = (400, 422)
REFUSAL_WORDS = re.compile(
    r"response_format|json_schema|json_object|schema|structured|format", re.I
)
# Providers whose OpenAI-compatible API takes json_object but refuses json_schema.
JSON_OBJECT_HOSTS = ("api.deepseek.com", "api.groq.com", "api.moonshot.cn", "api.moonshot.ai")

_accepted: dict[tuple[str, str], str] = {}  # (base url, model) -> the strictest it took
_lock = threading.Lock()


def default_format(base_url: str) -> str:
    """What ``auto`` tries first for ``base_url``."""
    host = (urlsplit(base_url).hostname or "").casefold()
    return "json_object" if host in JSON_OBJECT_HOSTS else "json_schema"


def _weakest(*formats: str) -> str:
    return max(formats, key=FORMATS.index)


def _configured(llm: ChatLLM) -> str:
    setting = settings.LLM_RESPONSE_FORMAT
    return default_format(llm.base_url) if setting == "auto" else setting


def first_format(llm: ChatLLM, model: str) -> str:
    """The format a first ask uses: the setting's, or weaker if this endpoint and model
    refused it before."""
    known = _accepted.get((llm.base_url, model))
    configured = _configured(llm)
    return _weakest(configured, known) if known else configured


def strict_format(llm: ChatLLM, model: str) -> str:
    """The format an answer that could not be read is asked again in: the strictest the
    endpoint and model did not refuse (none when the setting says none)."""
    if settings.LLM_RESPONSE_FORMAT == "none":
        return "none"
    return _accepted.get((llm.base_url, model), "json_schema")


def payload(fmt: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    """The ``response_format`` field for ``fmt`` (``schema``: ``{"name", "schema"}``)."""
    if fmt == "json_schema":
        return {"type": "json_schema", "json_schema": {**schema, "strict": True}}
    if fmt == "json_object":
        return {"type": "json_object"}
    return None


def complete(
    llm: ChatLLM, messages: list[dict[str, str]], *, schema: dict[str, Any], fmt: str,
    **kwargs: Any,
) -> ChatResult:  # fmt: skip
    """One completion asking for ``fmt``; refused (400/422), asked again with the next
    weaker format at once. Other provider errors, and a refusal of the prompt alone,
    are raised."""
    model = str(kwargs.get("model") or llm.model)
    first = fmt
    while True:
        field = payload(fmt, schema)
        try:
            result = llm.complete(
                messages, **kwargs, **({"response_format": field} if field else {})
            )
        except ProviderError as exc:
            if field is None or not refuses_format(exc):
                raise
            weaker = FORMATS[FORMATS.index(fmt) + 1]
            logger.warning("the LLM refused response_format %s (%s); asking with %s",
                           fmt, exc, weaker)  # fmt: skip
            fmt = weaker
            continue
        if fmt != first:
            with _lock:
                _accepted[(llm.base_url, model)] = _weakest(
                    fmt, _accepted.get((llm.base_url, model), fmt)
                )
        return result


def refuses_format(exc: ProviderError) -> bool:
    """A 400 or 422 whose message names the field (not a bad model name, a prompt too
    long...: those are raised as they are)."""
    return exc.status_code in REFUSED_STATUSES and bool(REFUSAL_WORDS.search(str(exc)))


def forget() -> None:
    """Forget what endpoints refused (tests; a process restart does the same)."""
    with _lock:
        _accepted.clear()
