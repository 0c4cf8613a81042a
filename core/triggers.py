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


def half_copies_sql(
    *,
    table: str,
    copies: str,
    function: str,
    columns: str,
    keep: str,
    old: str,
    new: str,
    key: tuple[str, ...] = ("id",),
) -> tuple[str, str]:
    """(``CREATE FUNCTION function``, the batch copy) of a table of 16-bit copies:
    ``copies`` holds, per row of ``table`` that ``keep`` admits, its ``columns`` and
    ``half``, its ``embedding`` normalised to length 1 as ``halfvec``.

    The function is the one of every statement trigger that keeps the copies
    (``statement_triggers``, ``old`` and ``new`` its transition tables): an insert
    copies, a delete removes by ``key``, a truncate empties, an update replaces the
    copies of the rows whose copied columns or vector changed (an edit of any other
    column changes nothing). The batch copy is ``copy_in_batches``'s ``copy_sql``."""
    on = " AND ".join(f"h.{col} = o.{col}" for col in key)
    function_sql = f"""
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE {copies};
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        -- The copies of the rows whose copied columns changed are replaced (an edit of
        -- any other column changes nothing here).
        DELETE FROM {copies} h USING (
            SELECT {columns}, embedding FROM {old}
            EXCEPT SELECT {columns}, embedding FROM {new}) o
        WHERE {on};
        INSERT INTO {copies} ({columns}, half)
        SELECT {columns}, l2_normalize(embedding)::halfvec FROM (
            SELECT {columns}, embedding FROM {new}
            EXCEPT SELECT {columns}, embedding FROM {old}) n
        WHERE {keep};
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM {copies} h USING {old} o WHERE {on};
        RETURN NULL;
    END IF;
    INSERT INTO {copies} ({columns}, half)
    SELECT {columns}, l2_normalize(embedding)::halfvec FROM {new}
    WHERE {keep};
    RETURN NULL;
END $$;
"""
    copy_sql = f"""
INSERT INTO {copies} ({columns}, half)
SELECT {columns}, l2_normalize(embedding)::halfvec FROM {table}
WHERE id > %s AND id <= %s AND {keep}
FOR SHARE
ON CONFLICT DO NOTHING
"""
    return function_sql, copy_sql


def store_copies_plain(*, copies: str, index: str) -> Any:
    """A migration's operation storing the ``half`` column of the 16-bit copies
    ``copies`` as it is (``PLAIN``), in the table and in its scope index ``index``
    (rebuilt concurrently, as its writes go on): never compressed. With ``MAIN`` a btree
    compresses any column of more than 512 bytes of an index tuple, so a copy that
    compresses (an embedding with many zeros, as the hashing embedder's) was decompressed
    for every row an exact ranking read: 10,000 copies took 17 ms to rank instead of 4
    (BENCHMARKS.md, "The stores' 15 ms: copies stored plain, text vectors in line, one
    walk"). A copy that does not compress (a dense embedding) was stored as it is
    already; it no longer costs a compression attempt when written. Nothing to do where
    the copies do not exist (pgvector without ``halfvec``); nothing to undo (plain copies
    rank the same). For a migration with ``atomic = False``."""
    from django.db import migrations

    def forward(apps: Any, schema_editor: Any) -> None:
        with schema_editor.connection.cursor() as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s)", [copies, index])
            table, built = cur.fetchone()
            if not table:
                return
            # A rebuild interrupted before (its copy is left invalid, and slows writes).
            cur.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
                " WHERE c.relname LIKE %s AND NOT i.indisvalid",
                [f"{index}_ccnew%"],
            )
            stale = [row[0] for row in cur.fetchall()]
        for name in stale:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        # (a brief exclusive lock on the copies: it waits for the statements reading them)
        schema_editor.execute(f"ALTER TABLE {copies} ALTER COLUMN half SET STORAGE PLAIN")
        if built is not None:
            # (an index column keeps the storage it was built with: rebuilt, it takes the table's)
            schema_editor.execute(f"REINDEX INDEX CONCURRENTLY {index}")

    return migrations.RunPython(forward, migrations.RunPython.noop, atomic=False)
