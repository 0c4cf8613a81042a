"""Facts in time: what the service believed at a time (``as_of``) and what was true in the
world at a time (``valid_at``).

A fact's current version is its row in ``memories_fact`` (``recorded_from``: its
``recorded_at``); each change closes the version it replaces into
``memories_factversion`` (``services._close``). The view ``memories_fact_timeline``
(migration 0016) holds both. A read at ``At(as_of=T, valid_at=V)`` takes:

- the versions believed at T: recorded at or before T and not closed by then
  (``recorded_to`` after T, or still current); with ``valid_at``, also the versions a
  change in the world closed by then (``superseded``: "lived in Lisbon" until the move
  to Porto is still what the service knows of the past);
- with ``valid_at``, of those, the ones true at V: ``valid_from`` (none: always) at or
  before V and ``valid_to`` (none: still) after it.

Reads without either are reads of current facts and never touch the view.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from core.errors import InvalidInput
from core.times import RANGE, storable


@dataclass(frozen=True)
class At:
    """When a read looks: ``as_of`` (None: now) and ``valid_at`` (None: any)."""

    as_of: datetime | None = None
    valid_at: datetime | None = None

    @property
    def past(self) -> bool:
        return self.as_of is not None or self.valid_at is not None

    def when(self) -> datetime:
        return self.as_of or timezone.now()

    def sql(self, alias: str = "") -> tuple[str, list[Any]]:
        """The condition on timeline rows (``alias``: their table's, with its dot)."""
        a = alias
        t = self.when()
        closed = f"{a}recorded_to > %s" + (f" OR {a}superseded" if self.valid_at else "")
        sql = f"{a}recorded_from <= %s AND ({a}recorded_to IS NULL OR {closed})"
        params: list[Any] = [t, t]
        if self.valid_at is not None:
            sql += (
                f" AND ({a}valid_from IS NULL OR {a}valid_from <= %s)"
                f" AND ({a}valid_to IS NULL OR {a}valid_to > %s)"
            )
            params += [self.valid_at, self.valid_at]
        return sql, params


def instant(value: Any, name: str) -> datetime | None:
    """A time a client sent (ISO 8601: a date, or a date and time; without a zone, UTC)
    as an aware datetime; None for nothing. Unreadable, or outside the times the service
    stores (``core.times``, from 1900 to before 9999 in UTC): ``InvalidInput`` naming
    ``name``."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        when: datetime | None = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            when = parse_datetime(text)
            if when is None and (day := parse_date(text)) is not None:
                when = datetime(day.year, day.month, day.day)
        except ValueError:
            when = None
    else:
        when = None
    if when is None:
        raise InvalidInput(
            f"{name} is not a date or time (ISO 8601)", details={name: "not an ISO 8601 time"}
        )
    if not timezone.is_aware(when):
        when = timezone.make_aware(when, UTC)
    if not storable(when):
        raise InvalidInput(f"{name} is not {RANGE}", details={name: f"not {RANGE}"})
    return when


def at_from(as_of: Any = None, valid_at: Any = None) -> At | None:
    """``At`` from what a client sent (None when it sent neither). ``as_of`` in the
    future is refused: the service cannot know what it will believe."""
    when = instant(as_of, "as_of")
    if when is not None and when > timezone.now():
        raise InvalidInput("as_of is in the future", details={"as_of": "in the future"})
    at = At(when, instant(valid_at, "valid_at"))
    return at if at.past else None
