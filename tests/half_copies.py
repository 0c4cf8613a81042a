"""What the 16-bit copies of a table's vectors must hold, checked against the table."""

from __future__ import annotations

from django.db import connection


def copies_out_of_sync(*, table: str, copies: str, columns: str, where: str) -> list[tuple]:
    """Rows where ``copies`` differs from what ``table``'s rows matching ``where`` say it
    must hold (``columns`` and the unit vector as ``halfvec``), both ways: ``missing``
    and ``stale`` rows."""
    with connection.cursor() as cur:
        cur.execute(
            f"WITH want AS (SELECT {columns}, l2_normalize(embedding)::halfvec::text AS half "
            f"FROM {table} WHERE {where}), "
            f"have AS (SELECT {columns}, half::text FROM {copies}) "
            "(SELECT 'missing', * FROM (SELECT * FROM want EXCEPT ALL SELECT * FROM have) a) "
            "UNION ALL (SELECT 'stale', * FROM (SELECT * FROM have EXCEPT ALL SELECT * FROM want) b)"
        )
        return cur.fetchall()


def copies_of(copies: str, columns: str, where: str, value: object) -> dict[object, tuple]:
    """``copies``' rows with ``where`` = ``value`` as {id: (columns...)}: which rows a write
    left in place (their ``ctid`` / ``xmin``) and what they hold."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT id, {columns} FROM {copies} WHERE {where} = %s", [value])
        return {row[0]: row[1:] for row in cur.fetchall()}
