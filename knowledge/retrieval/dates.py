"""Dates a query names, as periods a row's time can fall in.

"When did she go camping in June?", "What did he show her on October 13, 2023?", "the
beach in 2023": a chat's turns carry the time they were said, and the event a question
names by its date was usually told of on that date or in the days after it ("we went
camping two weekends ago"). The engine lifts the rows told of in such a period
(``Dated``, tested by ``engine._period_tests``); this module reads the periods out of the
text.

What is read, English only, written out (no relative dates: "last week" of a question
is not the week before its row's time):
- a day: ``October 13, 2023``, ``13 October 2023``, ``1 February, 2023``, ``Oct 13th``,
  ``2023-10-13``;
- a month: ``October 2023``, or a month's full name after a preposition (``in June``,
  ``In June``, ``since March``), which keeps "May I ..." and "June said ..." out;
- a year after a preposition of time: ``in 2023``, ``during 1999`` (not "2000 calories",
  nor "a diet of 2000 calories").

A heuristic: "May 5 people" reads as May 5, "a gift from June" as June.

A period is (year, month, day), 0 where the text names none: ``(0, 6, 0)`` is any June.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, timedelta

# A row told of in a period the query names, or up to GRACE_DAYS after it, has its own
# score s lifted to s + (1 - s) x LIFT (BENCHMARKS.md, "Dates the question names").
LIFT = 0.3
GRACE_DAYS = 7


@dataclass(frozen=True)
class Dated:
    """Periods a query names (``periods``): a candidate whose ``Collection.event_time``
    falls in one, or up to ``grace`` days after it, has its own score s lifted to
    s + (1 - s) x ``lift`` before context (an event is often told of in the days after
    it). The engine applies it to fused scores only (not rrf, not one leg's raw values)."""

    periods: tuple[tuple[int, int, int], ...]
    lift: float = LIFT
    grace: int = GRACE_DAYS

    def __post_init__(self) -> None:
        if not 0 <= self.grace <= 27:  # (shorter than any month: ``engine._period_tests``)
            raise ValueError("grace must be 0 to 27 days")

    def windows(self) -> tuple[str, list[int], list[tuple[int, int]]]:
        """The periods as the engine tests them: those with a year as one
        ``datemultirange`` literal of their windows, grace included ("" if none); the
        months named without a year; the (month, day) named without a year."""
        spans: list[tuple[date, date]] = []
        months: list[int] = []
        days: list[tuple[int, int]] = []
        for year, month, day in self.periods:
            if not year and day:
                days.append((month, day))
                continue
            if not year:
                months.append(month)
                continue
            if day:
                start = end = date(year, month, day)
            elif month:
                start = date(year, month, 1)
                end = date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)
            else:
                start, end = date(year, 1, 1), date(year, 12, 31)
            spans.append((start, end + timedelta(days=self.grace + 1)))
        ranges = ",".join(f"[{a.isoformat()},{b.isoformat()})" for a, b in sorted(spans))
        return ("{" + ranges + "}" if spans else ""), months, days


def dated(text: str | None) -> Dated | None:
    """The lift for a query's text: None when it names no date."""
    named = periods(text or "")
    return Dated(tuple(named), LIFT, GRACE_DAYS) if named else None


MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
_NUMBER = {name.lower(): i for i, name in enumerate(MONTHS, 1)}
_NUMBER |= {name[:3].lower(): i for i, name in enumerate(MONTHS, 1)}
_NUMBER["sept"] = 9

_FULL = "|".join(MONTHS)
# With a day or a year beside it a month may be short ("Oct 13", "Sept. 2023").
_ANY = "|".join([*MONTHS, "Sept", *(m[:3] for m in MONTHS)])
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d\d)"
# (any case: a question may open with one, "In June, ...")
_PREPOSITION = r"(?i:in|on|during|since|by|until|till|through|throughout|of|from|before|after)"
# A year is read after these only ("of 2000 calories", "from 1999 people" are no years).
_YEAR_PREPOSITION = r"(?i:in|during|since|by|until|till|through|throughout|before|after)"

_PATTERNS = (
    # 2023-10-13
    ("ymd", re.compile(r"\b" + _YEAR + r"-(\d{1,2})-(\d{1,2})\b")),
    # October 13, 2023 / Oct. 13th / October 13
    ("mdy", re.compile(r"\b(" + _ANY + r")\.? " + _DAY + r"\b(?:,? " + _YEAR + r"\b)?")),
    # 13 October, 2023 / 13th of October / 1 February
    ("dmy", re.compile(r"\b" + _DAY + r" (?:of )?(" + _ANY + r")\b\.?(?:,? " + _YEAR + r"\b)?")),
    # October 2023 / Oct, 2023
    ("my", re.compile(r"\b(" + _ANY + r")\.?,? " + _YEAR + r"\b")),
    # in June
    ("m", re.compile(r"\b" + _PREPOSITION + r" (?:early |late |mid-?)?(" + _FULL + r")\b")),
    # in 2023
    ("y", re.compile(r"\b" + _YEAR_PREPOSITION + r" (?:early |late |mid-?)?" + _YEAR + r"\b")),
)


def _valid(year: int, month: int, day: int | None) -> bool:
    """Whether a month (and day, None when the text named none) exists: 2023-00-05,
    October 0 and February 30 do not."""
    if not 1 <= month <= 12:
        return False
    if day is None:
        return True
    try:
        date(year or 2000, month, day)  # (2000: a leap year, so "February 29" passes)
    except ValueError:
        return False
    return True


def periods(text: str) -> list[tuple[int, int, int]]:
    """The periods ``text`` names, in order, each once: (year, month, day), 0 for a part it
    does not name. A span read as a day is not read again as its month or year."""
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, tuple[int, int, int]]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if any(m.start() < end and start < m.end() for start, end in taken):
                continue
            day: int | None = None
            if kind == "ymd":
                year, month, day = int(m[1]), int(m[2]), int(m[3])
            elif kind == "mdy":
                year, month, day = int(m[3] or 0), _NUMBER[m[1].lower()], int(m[2])
            elif kind == "dmy":
                year, month, day = int(m[3] or 0), _NUMBER[m[2].lower()], int(m[1])
            elif kind == "my":
                year, month = int(m[2]), _NUMBER[m[1].lower()]
            elif kind == "m":
                year, month = 0, _NUMBER[m[1].lower()]
            else:
                year, month = int(m[1]), 0
            if kind != "y" and not _valid(year, month, day):
                continue
            taken.append((m.start(), m.end()))
            found.append((m.start(), (year, month, day or 0)))
    out: list[tuple[int, int, int]] = []
    for _, period in sorted(found):
        if period not in out:
            out.append(period)
    return out
