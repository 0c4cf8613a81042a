"""The times the service stores: aware, from 1900 to before 9999 (UTC).

PostgreSQL keeps far wider times than Python reads back: a client's
``9999-12-31T23:59:59-05:00`` is the year 10000 in UTC, which the database stores and
psycopg then cannot load, so every read of the row fails. Each door that stores a
client's time checks it here first (a 400 naming the field).
"""

from __future__ import annotations

from datetime import UTC, datetime

EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)  # (a year short: no offset reaches past 9999)
RANGE = "from 1900 to before 9999 (UTC)"


def storable(when: datetime) -> bool:
    """Whether an aware ``when`` is in the range the service stores."""
    return EARLIEST <= when < LATEST
