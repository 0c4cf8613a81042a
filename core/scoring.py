"""The one decay function: exponential, halving every ``half_life_days``.

(The engine's search computes the same in SQL, with the same float operations:
``knowledge.retrieval.engine``, its fusion SQL.)"""

from __future__ import annotations

import math
from datetime import datetime

from django.utils import timezone


def decay(observed_at: datetime, half_life_days: float, *, now: datetime | None = None) -> float:
    """``0.5 ** (age / half_life)``, the age in days since ``observed_at`` (never negative)."""
    now = now or timezone.now()
    age_days = max(0.0, (now - observed_at).total_seconds() / 86400)
    return math.pow(0.5, age_days / half_life_days)
