"""Row-level security in the database: owner columns, the policy on every owner's table,
the service role's grants (what ``core.tenancy`` sets, these check).

- ``owner_column_sql``: the migrations that give a table its ``owner_id`` (the tables
  whose owner was known only through a parent: the chunks, the facts' links, changes
  and 16-bit copies, the keyword statistics...). The column is filled from the parent
  by a trigger on insert, so no code path has to set it and none can set it wrong
  (the policy's check refuses another owner's id).
- ``secure_tables``: run by ``migrate`` (as the tables' owner) after the migrations:
  every table of the schema with an ``owner_id`` column gets row-level security and
  the policy ``owner_rows`` (a table added later gets it at its migration, whoever
  forgets); the service's role gets read and write (not ``TRUNCATE``, not DDL) on
  every table, and ``MAINTAIN`` (``VACUUM``, ``ANALYZE``) from PostgreSQL 17.

The policy: a row is visible and writable when ``memory.bypass`` is ``on`` or its
``owner_id`` is ``memory.owner_id``. Each setting is read once per statement (the
``SELECT`` makes it an init plan, not a call per row). The owner setting is read only
when there is no bypass (a ``CASE``: a row lock's recheck evaluates every init plan,
whichever arm of the ``OR`` needs it), and must then be an owner id: empty (a
transaction that said nobody) it is an error, not an empty answer.

PostgreSQL lets a non-leakproof operator of a query use an index only after the
policy's own condition; the text search match (``@@``, ``ts_match_vq``) is not marked
leakproof, so the keyword legs would scan instead of using their GIN indexes.
``secure_tables`` marks it leakproof when it runs as a superuser (the embedded database;
``docs/operations.md`` says what to run on an external PostgreSQL). It only compares
its two arguments and raises no error that depends on a row.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

POLICY = "owner_rows"
# Written on each policy (its comment): a policy of an older text gets today's.
POLICY_VERSION = "owner_rows 2"
_BYPASS = "current_setting('memory.bypass', true) = 'on'"
_VISIBLE = (
    f"(SELECT {_BYPASS}) OR owner_id = (SELECT CASE WHEN {_BYPASS} THEN NULL "
    "ELSE current_setting('memory.owner_id')::integer END)"
)
# The text search match, and what the chunks' scoped text index computes from a row
# (``knowledge`` 0012: the text's lexemes plus a base and a session token): a
# condition on an expression is promoted to an index condition only when every
# function applied to the row in it is leakproof.
LEAKPROOF_FUNCTIONS = (
    "ts_match_vq(tsvector, tsquery)",
    "tsquery_and(tsquery, tsquery)",
    "tsvector_concat(tsvector, tsvector)",
    "array_to_tsvector(text[])",
    "textcat(text, text)",
    "uuid_out(uuid)",
    "textin(cstring)",
)


def owner_column_sql(table: str, *, parent: str, via: str, parent_key: str = "id") -> str:
    """Forward SQL giving ``table`` an ``owner_id`` filled from ``parent`` (whose
    ``parent_key`` is this table's ``via``): the column, its value for the rows there
    are, the trigger that fills it on every insert (and on a change of ``via``)."""
    function = f"{table}_owner"
    # The rows there are get their owner by a rewrite of the table (a change of the new
    # column's type to itself, computed from the parent), not an UPDATE: an UPDATE of
    # every row fires the tables' statement triggers (the keyword statistics' compares
    # the old and new rows) and inserts each row's new version into every index, an
    # HNSW index's too, one by one; a rewrite fires no trigger and builds each index
    # once, in bulk, as CREATE INDEX does. It holds the table's exclusive lock meanwhile.
    return f"""
ALTER TABLE {table} ADD COLUMN owner_id integer;
CREATE FUNCTION {function}_of(key anyelement) RETURNS integer LANGUAGE sql STABLE
    AS $$ SELECT owner_id FROM {parent} WHERE {parent_key} = key $$;
ALTER TABLE {table} ALTER COLUMN owner_id TYPE integer USING {function}_of({via});
DROP FUNCTION {function}_of(anyelement);
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.owner_id IS NULL OR TG_OP = 'UPDATE' THEN
        SELECT p.owner_id INTO NEW.owner_id FROM {parent} p WHERE p.{parent_key} = NEW.{via};
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER {function} BEFORE INSERT OR UPDATE OF {via}, owner_id ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
ALTER TABLE {table} ALTER COLUMN owner_id SET NOT NULL;
"""


def owner_covering_sql(
    name: str, table: str, columns: str, include: str = ""
) -> tuple[list[str], list[str]]:
    """(forward, backward) rebuilding index ``name`` of ``table`` (on ``columns``, with
    ``include``) so it also covers ``owner_id``: an index-only scan of it must read
    the policy's column from the index, or it turns into a scan of the heap (a scope's
    1,500 chunks counted: 0.35 ms from the index, 2.5 ms through the heap). Built
    concurrently under a new name, the old one dropped, then renamed: the table stays
    writable. For ``RunSQL`` in a migration with ``atomic = False``."""

    def swap(include_columns: str) -> list[str]:
        covered = f" INCLUDE ({include_columns})" if include_columns else ""
        return [
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name}_next ON {table} ({columns}){covered}",
            f"DROP INDEX CONCURRENTLY IF EXISTS {name}",
            f"ALTER INDEX {name}_next RENAME TO {name}",
        ]

    return swap(", ".join(c for c in (include, "owner_id") if c)), swap(include)


def owner_in_unique(
    name: str, table: str, columns: str, *, kind: str = "unique", where: str = ""
) -> list[Any]:
    """The migration operations giving the unique constraint (``kind`` ``unique`` or
    ``primary``) or unique index (``index``, partial with ``where``) ``name`` of
    ``table``, today on ``columns``, the ``owner_id`` as its last column: a table
    distributed by owner (Citus, ``docs/scaling.md``) accepts only unique keys that
    hold it. The owner follows from the key's parent, so the new key refuses the same
    rows; last, it leaves every lookup of today's columns a prefix of the index.

    The new index is built concurrently (the table stays writable), then takes the
    old one's place and name: a constraint's in one statement (``ADD ... USING INDEX``
    renames it; a brief exclusive lock), an index's dropped concurrently, then renamed. For a migration with ``atomic = False``; ``ON CONFLICT`` clauses on
    these keys name the constraint (``ON CONFLICT ON CONSTRAINT``), not its columns."""
    from django.db import migrations

    condition = f" WHERE {where}" if where else ""

    def build(suffix: str, cols: str) -> tuple[str, ...]:
        index = f"{name}_{suffix}"
        return (
            f"DROP INDEX CONCURRENTLY IF EXISTS {index}",  # (a build that failed half-way)
            f"CREATE UNIQUE INDEX CONCURRENTLY {index} ON {table} ({cols}){condition}",
        )

    def swap(suffix: str) -> tuple[str, ...]:
        index = f"{name}_{suffix}"
        if kind == "index":  # (a unique index's twin keeps the rows unique meanwhile)
            return (f"DROP INDEX CONCURRENTLY {name}", f"ALTER INDEX {index} RENAME TO {name}")
        key = {"unique": "UNIQUE", "primary": "PRIMARY KEY"}[kind]
        return (
            f"ALTER TABLE {table} DROP CONSTRAINT {name}, "
            f"ADD CONSTRAINT {name} {key} USING INDEX {index}",
        )

    return [
        migrations.RunSQL(
            build("next", f"{columns}, owner_id"), f"DROP INDEX IF EXISTS {name}_next"
        ),
        migrations.RunSQL(swap("next"), build("prev", columns) + swap("prev")),
    ]


def owner_column(table: str, *, parent: str, via: str) -> Any:
    """The migration operation of ``owner_column_sql`` (and its reverse)."""
    from django.db import migrations

    return migrations.RunSQL(
        owner_column_sql(table, parent=parent, via=via), owner_column_reverse_sql(table)
    )


def owner_column_reverse_sql(table: str) -> str:
    return f"""
DROP TRIGGER IF EXISTS {table}_owner ON {table};
DROP FUNCTION IF EXISTS {table}_owner();
DROP POLICY IF EXISTS {POLICY} ON {table};
ALTER TABLE {table} DROP COLUMN owner_id;
"""


def owner_tables(cursor: Any) -> list[str]:
    """Every table of the current schema with an ``owner_id`` column."""
    cursor.execute(
        """SELECT c.relname FROM pg_class c
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'owner_id'
                              AND NOT a.attisdropped
           WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
           ORDER BY 1"""
    )
    return [row[0] for row in cursor.fetchall()]


def secure_tables(connection: BaseDatabaseWrapper, service_role: str | None) -> list[str]:
    """Row-level security and the policy on every owner's table, the service role's
    grants, ``@@`` leakproof where allowed; idempotent, and changing nothing that is
    already so: every ``serve`` runs it (through ``migrate``) while other hosts serve,
    and an ``ALTER POLICY`` locks its table. Returns the tables secured."""
    with connection.cursor() as cur:
        tables = owner_tables(cur)
        cur.execute(
            "SELECT c.relname, c.relrowsecurity, p.oid IS NOT NULL, "
            "obj_description(p.oid, 'pg_policy') "
            "FROM pg_class c LEFT JOIN pg_policy p ON p.polrelid = c.oid AND p.polname = %s "
            "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')",
            [POLICY],
        )
        state = {row[0]: row[1:] for row in cur.fetchall()}
        for table in tables:
            enabled, exists, version = state[table]
            if not enabled:
                cur.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            if version == POLICY_VERSION:
                continue
            verb = "ALTER" if exists else "CREATE"
            cur.execute(
                f"{verb} POLICY {POLICY} ON {table} USING ({_VISIBLE}) WITH CHECK ({_VISIBLE})"
            )
            cur.execute(f"COMMENT ON POLICY {POLICY} ON {table} IS '{POLICY_VERSION}'")
        if service_role:
            _grant(connection, cur, service_role)
        cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if cur.fetchone()[0]:
            for function in leakproof_missing(cur):
                cur.execute(f"ALTER FUNCTION {function} LEAKPROOF")
    return tables


def _grant(connection: BaseDatabaseWrapper, cur: Any, service_role: str) -> None:
    """The service's role's privileges on every table and sequence, granted only when
    one lacks them (a new table's migration)."""
    tables = ["SELECT", "INSERT", "UPDATE", "DELETE"]
    if getattr(connection, "pg_version", 0) >= 170000:  # (VACUUM, ANALYZE from 17 on)
        tables.append("MAINTAIN")
    # (a privilege list asks whether any of them is held: each is asked alone)
    every_table = " AND ".join(f"has_table_privilege(%(role)s, oid, '{p}')" for p in tables)
    every_sequence = " AND ".join(
        f"has_sequence_privilege(%(role)s, oid, '{p}')" for p in ("USAGE", "SELECT", "UPDATE")
    )
    cur.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
        f"AND ((relkind IN ('r', 'p') AND NOT ({every_table})) "
        f"OR (relkind = 'S' AND NOT ({every_sequence}))))",
        {"role": service_role},
    )
    if not cur.fetchone()[0]:
        return
    role = connection.ops.quote_name(service_role)
    schema = connection.ops.quote_name(_schema(cur))
    cur.execute(f"GRANT {', '.join(tables)} ON ALL TABLES IN SCHEMA {schema} TO {role}")
    cur.execute(f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")


def _schema(cur: Any) -> str:
    cur.execute("SELECT current_schema()")
    return str(cur.fetchone()[0])


def leakproof_missing(cursor: Any) -> list[str]:
    """The functions ``secure_tables`` wants leakproof that are not (an external
    PostgreSQL where migrations do not run as a superuser)."""
    missing = []
    for function in LEAKPROOF_FUNCTIONS:
        cursor.execute("SELECT proleakproof FROM pg_proc WHERE oid = %s::regprocedure", [function])
        if not cursor.fetchone()[0]:
            missing.append(function)
    return missing


def row_security_health(owner_ids: list[int] | None = None) -> dict[str, Any]:
    """``/healthz``'s ``row_security``: whether the policies hold for the service's role
    (``enforced``: it owns no table, is no superuser and does not bypass them), how many
    tables they guard, and the functions that should be leakproof and are not."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT NOT (rolsuper OR rolbypassrls) AND NOT EXISTS ("
            "  SELECT 1 FROM pg_class WHERE relowner = r.oid"
            "  AND relnamespace = current_schema()::regnamespace)"
            " FROM pg_roles r WHERE rolname = current_user"
        )
        enforced = bool(cur.fetchone()[0])
        cur.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_policy p ON p.polrelid = c.oid "
            "WHERE p.polname = %s AND c.relrowsecurity "
            "AND c.relnamespace = current_schema()::regnamespace",
            [POLICY],
        )
        tables = int(cur.fetchone()[0])
        missing = leakproof_missing(cur)
    status = "ok" if enforced and not missing else "degraded"
    return {"status": status, "enforced": enforced, "tables": tables, "leakproof_missing": missing}
