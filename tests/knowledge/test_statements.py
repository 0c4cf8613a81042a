"""How the engine's statements reach PostgreSQL (``knowledge.retrieval.db``): their ``%s``
placeholders become PostgreSQL's own once per statement text, and the times they answer
are the values and zone the ORM loads."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from knowledge.retrieval import db


def test_placeholders_become_postgresql_s_own_once_per_statement_text():
    db.native_sql.cache_clear()
    sql = "SELECT %s::int, x LIKE 'a%%' FROM t WHERE y = %s AND z = %s"
    assert db.native_sql(sql) == "SELECT $1::int, x LIKE 'a%' FROM t WHERE y = $2 AND z = $3"
    assert db.native_sql("SELECT 1") == "SELECT 1"
    db.native_sql(sql)
    assert db.native_sql.cache_info().hits == 1 and db.native_sql.cache_info().misses == 2


@pytest.mark.parametrize("sql", ["SELECT %(name)s", "SELECT %b", "SELECT 'a%'"])
def test_other_placeholders_are_refused(sql):
    with pytest.raises(ValueError, match="%s placeholders only"):
        db.native_sql(sql)


@pytest.mark.django_db
def test_a_statement_runs_with_its_parameters_and_a_literal_percent():
    rows, names = db.fetch("SELECT %s::int + 1 AS n, 'a%%b' AS t, %s::text AS u", [41, "x%s"])
    assert rows == [(42, "a%b", "x%s")] and names == ["n", "t", "u"]
    # with settings before it (the pipeline's path), the settings' own placeholders too
    rows, _ = db.fetch(
        "SELECT current_setting('hnsw.ef_search'), %s::int", [7], local=[("hnsw.ef_search", 77)]
    )  # fmt: skip
    assert rows == [("77", 7)]


@pytest.mark.django_db
def test_times_load_as_the_orm_loads_them():
    moment = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=timezone(timedelta(hours=2)))
    rows, _ = db.fetch("SELECT %s::timestamptz, NULL::timestamptz", [moment])
    assert rows[0][0] == moment and rows[0][0].utcoffset() == timedelta(0)
    assert rows[0][0].isoformat() == "2026-03-04T03:06:07.891011+00:00"
    assert rows[0][1] is None
