"""Statement-level triggers with transition tables, as migrations declare them: the
database keeps a derived table or column in the write's own transaction, whatever code
path wrote (the ORM, a COPY, a cascade)."""

from __future__ import annotations

from collections.abc import Mapping

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
