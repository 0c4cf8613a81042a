"""Failover without lost writes (issue 28, item 2, at the database's level): a primary
and a synchronous streaming standby the test starts from the embedded PostgreSQL's
binaries; writes go through Django's connection made from a multi-host ``DATABASE_URL``
(``target_session_attrs=read-write``), request by request as Django serves them; the
primary's postmaster is killed (``kill -9``) while they run and the standby promoted.
Every write that was acknowledged is on the promoted server, and the writes go on there
without any reconfiguration."""

from __future__ import annotations

import threading
import time
import urllib.parse

import pytest
from django.db import DatabaseError, connection, connections
from django.db.backends.postgresql.base import DatabaseWrapper

from memoryproject.env import database_from_url
from tests.pg_cluster import start_pair

pytestmark = pytest.mark.slow


def _multi_host_url(pair) -> str:
    hosts = ",".join(f"{urllib.parse.quote(str(s.socket_dir), safe='')}:{s.port}"
                     for s in (pair.primary, pair.standby))  # fmt: skip
    return (
        f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write&connect_timeout=2"
    )


def test_no_acknowledged_write_is_lost_when_the_primary_dies(django_db_blocker):
    pair = start_pair(synchronous=True)
    watchdog = threading.Timer(90, pair.stop)  # a commit that waits forever ends the test
    watchdog.start()
    try:
        with django_db_blocker.unblock():  # (a database of its own, not the test one)
            acknowledged, failed, servers, after = _write_through_a_failover(pair)
        with pair.standby.connect() as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
            stored = {r[0] for r in conn.execute("SELECT id FROM acknowledged")}
    finally:
        watchdog.cancel()
        pair.stop()
    print(f"acknowledged {len(acknowledged)}, refused {failed}")
    assert after == 100, (len(acknowledged), failed)  # it went on after the failover
    assert set(acknowledged) <= stored  # nothing acknowledged was lost
    assert servers == {pair.primary.port, pair.standby.port}  # it moved by itself


def _write_through_a_failover(pair) -> tuple[list[int], int, set[int], int]:
    """Writes, each one request's, until 100 are acknowledged after the standby took
    over; the primary is killed and the standby promoted 1 s in, while they run."""
    with pair.primary.connect() as conn:
        conn.execute("CREATE TABLE acknowledged (id bigint PRIMARY KEY, note text)")
    settings = {**connection.settings_dict,
                **database_from_url(_multi_host_url(pair), conn_max_age=60)}  # fmt: skip
    wrapper = DatabaseWrapper(settings, "failover")
    connections["failover"] = wrapper  # (django.contrib.postgres looks it up)
    switched = threading.Event()

    def fail_over() -> None:
        time.sleep(1.0)
        pair.primary.kill()
        pair.standby.promote()
        # The promoted server inherited synchronous_standby_names: until it has a standby
        # of its own, its commits would wait for none (what a failover manager does).
        with pair.standby.connect() as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            conn.execute("SELECT pg_reload_conf()")
        switched.set()

    threading.Thread(target=fail_over, daemon=True).start()
    acknowledged: list[int] = []
    servers: set[int] = set()
    n = failed = after = 0
    deadline = time.monotonic() + 60
    try:
        while after < 100 and time.monotonic() < deadline:
            n += 1
            wrapper.close_if_unusable_or_obsolete()  # what each request does first
            try:
                with wrapper.cursor() as cur:
                    cur.execute("INSERT INTO acknowledged VALUES (%s, 'a fact')", [n])
                    servers.add(int(wrapper.connection.info.port))
                acknowledged.append(n)  # the commit answered: a 2xx to the client
                after += switched.is_set()
            except DatabaseError:
                failed += 1  # (an error answered: the client knows to retry)
                time.sleep(0.05)
    finally:
        wrapper.close()
        del connections["failover"]
    return acknowledged, failed, servers, after
