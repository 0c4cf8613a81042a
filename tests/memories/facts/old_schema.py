"""The facts tables under the names migrations 0008-0010 knew (before 0012 renamed them),
for the tests that run those migrations again on tables holding facts: inside the
test's transaction, then back to today's names (and today's triggers)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from core.db_backend.base import service_role, table_owner
from core.row_security import owner_column_sql, secure_tables

RENAME = importlib.import_module("memories.facts.migrations.0012_rename_facts")
TABLES = [("memories_fact", "memories_vector"), ("memories_scope", "memories_enduser"),
          ("memories_factlink", "memories_uservector")]  # fmt: skip
COLUMNS = [("scope_id", "end_user_id"), ("fact_id", "vector_id")]  # of the links


def _rename(editor, back: bool) -> None:
    for new, old in TABLES:
        editor.execute(f"ALTER TABLE {new if back else old} RENAME TO {old if back else new}")
    link = "memories_uservector" if back else "memories_factlink"
    for new, old in COLUMNS:
        editor.execute(
            f"ALTER TABLE {link} RENAME COLUMN {new if back else old} TO {old if back else new}"
        )


def _owner_columns_and_policies() -> None:
    """What migrations after 0012 did that a test's rerun of 0008 undid: the 16-bit
    copies' owner column (0019), then every table's policy and the service's grants."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = 'memories_fact_half'::regclass "
            "AND attname = 'owner_id' AND NOT attisdropped"
        )
        if cur.fetchone() is None:
            cur.execute(owner_column_sql("memories_fact_half", parent="memories_fact", via="id"))
    secure_tables(connection, service_role(connection))


@contextmanager
def old_schema() -> Iterator[None]:
    """As the tables' owner (their DDL), for the block too."""
    with table_owner(connection):
        with connection.schema_editor(atomic=False) as editor:
            RENAME._drop_functions(RENAME.NEW)(None, editor)
            RENAME._raw_renames(False)(None, editor)
            _rename(editor, back=True)
            RENAME._create_functions(RENAME.OLD)(None, editor)
        try:
            yield
        finally:
            with connection.schema_editor(atomic=False) as editor:
                RENAME._drop_functions(RENAME.OLD)(None, editor)
                _rename(editor, back=False)
                RENAME._raw_renames(True)(None, editor)
                RENAME._create_functions(RENAME.NEW)(None, editor)
            _owner_columns_and_policies()
