"""``DATABASE_URL`` in libpq's multi-host form (issue 28, item 2's first step): the
settings read it themselves (``dj-database-url`` cannot), and a connection made from it
goes to the listed server that answers as asked, past one that is down."""

from __future__ import annotations

import urllib.parse

import pytest
from django.db import connection, connections
from django.db.backends.postgresql.base import DatabaseWrapper

from memoryproject.env import EnvError, database_from_url


def test_the_multi_host_form_is_read_into_libpq_lists():
    url = "postgresql://app:p%40ss@db1:5432,db2:5433,[::1]/memory?target_session_attrs=read-write"
    assert database_from_url(url, conn_max_age=60) == {
        "ENGINE": "core.db_backend", "NAME": "memory", "USER": "app",
        "PASSWORD": "p@ss", "HOST": "db1,db2,::1", "PORT": "5432,5433,5432",
        "CONN_MAX_AGE": 60, "OPTIONS": {"target_session_attrs": "read-write"},
    }  # fmt: skip
    single = database_from_url("postgres://app:pw@db1:5432/memory", conn_max_age=5)
    assert (single["HOST"], single["PORT"], single["NAME"]) == ("db1", 5432, "memory")


@pytest.mark.parametrize(
    "url",
    ["postgresql://u@db1:abc,db2/memory", "mysql://u@db1,db2/memory", "postgresql://u@,db2/m"],
)
def test_a_bad_multi_host_url_is_refused_naming_the_variable(url):
    with pytest.raises(EnvError, match="DATABASE_URL"):
        database_from_url(url, conn_max_age=0)


@pytest.mark.django_db
def test_a_connection_goes_past_a_server_that_is_down():
    live = connection.settings_dict
    assert live["HOST"] and live["PORT"]  # (the embedded server, found at first connect)
    hosts = ",".join(urllib.parse.quote(h, safe="") + f":{p}" for h, p in
                     (("/nonexistent-socket-dir", 5432), (live["HOST"], live["PORT"])))  # fmt: skip
    url = (f"postgresql://{live['USER']}@{hosts}/{live['NAME']}"
           "?target_session_attrs=read-write&connect_timeout=5")  # fmt: skip
    parsed = database_from_url(url, conn_max_age=0)
    wrapper = DatabaseWrapper(
        {**live, **parsed, "ENGINE": "django.db.backends.postgresql"}, "multi"
    )
    connections["multi"] = wrapper  # (django.contrib.postgres looks a new connection up)
    try:
        with wrapper.cursor() as cur:
            cur.execute("SELECT current_database(), pg_is_in_recovery()")
            assert cur.fetchone() == (live["NAME"], False)
        assert wrapper.connection.info.host == live["HOST"]
    finally:
        wrapper.close()
        del connections["multi"]
