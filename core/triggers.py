"""Statement-level triggers with transition tables, as migrations declare them: the
database keeps a derived table or column in the write's own transaction, whatever code
path wrote (the ORM, a COPY, a cascade)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_REFERENCING = {
    "insert": "REFERENCING NEW TABLE AS {new}",
    "update": "REFERENCING OLD TABLE AS {old} NEW TABLE AS {new}",
    "delete": "REFERENCING OLD TABLE AS {old}",
    "truncate": "",
}


def statement_triggers(
    *, table: str, prefix: str, functions: Mapping[str, str], old: str, new: str
) -> tuple[str, str]:
    """(create, drop) SQL of one ``AFTER <op> ... FOR EACH STATEMENT`` trigger
    ``<prefix>_<op>`` on ``table`` per operation of ``functions`` (``insert``,
    ``update``, ``delete``, ``truncate`` -> the function it runs), the rows a statement
    wrote named ``new`` and those it removed ``old``. ``drop`` drops the triggers and
    their functions."""
    create = "".join(
        f"CREATE TRIGGER {prefix}_{op} AFTER {op.upper()} ON {table} "
        f"{_REFERENCING[op].format(old=old, new=new)} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}();\n"
        for op, function in functions.items()
    )
    drop = "".join(f"DROP TRIGGER IF EXISTS {prefix}_{op} ON {table};\n" for op in functions)
    drop += "".join(
        f"DROP FUNCTION IF EXISTS {function}();\n" for function in dict.fromkeys(functions.values())
    )
    return create, drop


def copy_in_batches(
    schema_editor: Any, *, table: str, first: Any, copy_sql: str, batch: int
) -> None:
    """Fill a derived table from ``table`` in batches of ``batch`` rows in ``id`` order,
    each its own transaction, once the triggers that keep it are in place: ``copy_sql``
    copies the rows with ``first`` < id <= last (its two parameters), reading them
    ``FOR SHARE`` (a row being updated is read once its writer commits, whose trigger
    wrote its copy: ``ON CONFLICT DO NOTHING`` keeps that one; no writer changes a row
    read before the batch commits). For a ``RunPython`` with ``atomic=False``."""
    from django.db import transaction

    alias = schema_editor.connection.alias
    last = first
    while True:
        with transaction.atomic(using=alias), schema_editor.connection.cursor() as cur:
            cur.execute(
                f"SELECT id FROM (SELECT id FROM {table} WHERE id > %s ORDER BY id "
                f"LIMIT {int(batch)}) b ORDER BY id DESC LIMIT 1",
                [last],
            )
            row = cur.fetchone()
            if row is None:
                return
            cur.execute(copy_sql, [last, row[0]])
            last = row[0]
