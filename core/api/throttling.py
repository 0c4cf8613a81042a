"""Request rates per API key (DRF throttling), answered 429 with ``Retry-After``.

A fixed window per key and scope: ``API_THROTTLE_RATE`` for the API,
``CHAT_THROTTLE_RATE`` for the chat proxy (``"<n>/<second|minute|hour|day>"``, empty:
no limit). Session users (the admin, the browsable API) are not limited. Counts live in
the cache named by ``API_THROTTLE_CACHE``: by default a per-process memory cache (no
database query per request), so with W web workers a key may get up to W times the
rate; point it at a shared cache (Redis, memcached) for an exact limit.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.cache import caches
from rest_framework.throttling import BaseThrottle

from core.models import APIKey

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str | None) -> tuple[int, int] | None:
    if not rate:
        return None
    count, period = rate.split("/")
    return int(count), _PERIODS[period.strip()[0].lower()]


class APIKeyRateThrottle(BaseThrottle):
    setting = "API_THROTTLE_RATE"

    def __init__(self) -> None:
        self.wait_seconds: float | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        scope = getattr(view, "throttle_setting", self.setting)
        rate = parse_rate(getattr(settings, scope))
        if rate is None or not isinstance(request.auth, APIKey):
            return True
        limit, period = rate
        now = time.time()
        window = int(now // period)
        key = f"throttle:{scope}:{request.auth.pk}:{window}"
        cache = caches[settings.API_THROTTLE_CACHE]
        cache.add(key, 0, period + 1)
        try:
            count = cache.incr(key)
        except ValueError:
            cache.add(key, 1, period + 1)
            count = 1
        if count > limit:
            self.wait_seconds = max(1.0, (window + 1) * period - now)
            return False
        return True

    def wait(self) -> float | None:
        return self.wait_seconds
