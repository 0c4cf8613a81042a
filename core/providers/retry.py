"""Retry policy for provider calls: timeouts, 429 and 5xx only, with exponential backoff."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from core.providers.errors import (
    ProviderBadResponse,
    ProviderError,
    ProviderRateLimited,
    ProviderTimeout,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
MAX_RETRY_AFTER_SECONDS = 30.0


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    if response is None:
        return None
    raw = response.headers.get("retry-after")
    try:
        return min(float(raw), MAX_RETRY_AFTER_SECONDS) if raw is not None else None
    except ValueError:
        return None


def translate_error(exc: Exception) -> ProviderError:
    """Map an openai exception to our provider errors, keeping the message."""
    import openai  # imported where a provider is called: not by every process that starts

    if isinstance(exc, openai.APITimeoutError):
        return ProviderTimeout(f"provider timed out: {exc}")
    if isinstance(exc, openai.RateLimitError):
        return ProviderRateLimited(f"provider rate limit: {exc}")
    if isinstance(exc, openai.APIStatusError):
        error = ProviderError(f"provider answered {exc.status_code}: {exc.message}")
        error.status_code = 502 if exc.status_code >= 500 else exc.status_code
        return error
    if isinstance(exc, openai.APIConnectionError):
        return ProviderError(f"provider unreachable: {exc}")
    return ProviderBadResponse(f"provider sent an unusable response: {exc}")


def call_with_retries(
    fn: Callable[[], T],
    *,
    max_retries: int,
    backoff: float,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn``; on a timeout, 429 or 5xx wait and try again, at most ``max_retries`` times.

    Other errors (4xx, refused connections, malformed bodies) are not retried:
    repeating them cannot help. A ``ProviderError`` marked ``retryable`` (the chat
    proxy's relay raises those itself) is retried as the first kind. Every failure
    leaves as a ``ProviderError``.
    """
    import openai

    retryable = (openai.APITimeoutError, openai.RateLimitError, openai.InternalServerError)
    attempt = 0
    while True:
        try:
            return fn()
        except retryable as exc:
            error, delay = translate_error(exc), _retry_after(exc)
            error.__cause__ = exc
        except ProviderError as exc:
            if not exc.retryable:
                raise
            error, delay = exc, exc.retry_after
        except (openai.OpenAIError, ValueError, KeyError, TypeError) as exc:
            raise translate_error(exc) from exc
        if attempt >= max_retries:
            raise error
        if delay is None:
            delay = backoff * (2**attempt) * (1 + random.random() * 0.1)
        logger.warning("provider call failed (%s); retry %d in %.2fs", error, attempt + 1, delay)
        sleep(delay)
        attempt += 1
