"""Failover without lost writes (issue 28, item 2, at the database's level): a primary
and a synchronous streaming standby the test starts from the embedded PostgreSQL's
binaries; writes go through Django's connection made from a multi-host ``DATABASE_URL``
(``target_session_attrs=read-write``), request by request as Django serves them; the
primary's postmaster is killed (``kill -9``) while they run and the standby promoted.
Every write that was acknowledged is on the promoted server, and the writes go on there
without any reconfiguration."""

from __future__ import annotations

import random
import shutil
import threading
import time
import urllib.parse

import pytest
from django.db import DatabaseError, connection, connections
from django.db.backends.postgresql.base import DatabaseWrapper

from memoryproject.env import database_from_url
from scripts.faults.harness import Instance
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


@pytest.fixture
def served_on_a_pair():
    """The service (``manage.py serve``: web and worker) on a synchronous pair through a
    multi-host ``DATABASE_URL``; the pair's own servers, not the embedded one."""
    pair = start_pair(synchronous=True, port=54331)
    instance = Instance(env_overrides={"DATABASE_URL": _multi_host_url(pair)})
    try:
        instance.manage("migrate", "--no-input")
        instance.start()
        instance.wait_healthy()
        yield pair, instance
    finally:
        instance.stop()
        pair.stop()
        shutil.rmtree(instance.data_dir, ignore_errors=True)


def test_the_served_api_loses_no_acknowledged_fact_or_message(served_on_a_pair):
    """Under load through the API (two clients writing facts and messages), the primary
    killed and the standby promoted: every fact and message answered 2xx is on the
    promoted server, and the service writes there by itself."""
    pair, instance = served_on_a_pair
    flow = instance.post("/api/v1/flows", {"name": "failover"}).body["id"]
    rng = random.Random(28)
    words = ["".join(rng.choice("bcdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3))
             for _ in range(3000)]  # fmt: skip
    facts: list[str] = []
    messages: list[int] = []
    switched = threading.Event()
    after = [0]
    lock = threading.Lock()

    def write(n: int) -> None:
        deadline = time.monotonic() + 90
        local = random.Random(n)
        while after[0] < 60 and time.monotonic() < deadline:
            text = "User " + " ".join(local.choice(words) for _ in range(8))
            try:
                fact = instance.post(
                    "/api/v1/engine/facts",
                    {"scope": ["user", f"u{n}"], "content": text},
                    timeout=10,
                )
                said = instance.post(
                    "/api/v1/messages",
                    {"flow": flow, "session_id": f"s{n}", "role": "user", "content": text},
                    timeout=10,
                )
            except OSError:  # (no answer: nothing acknowledged)
                time.sleep(0.1)
                continue
            with lock:
                if fact.status == 201 and fact.body["decision"]["action"] == "add":
                    facts.append(fact.body["fact"]["id"])
                if said.status == 201:
                    messages.append(said.body["id"])
                    after[0] += switched.is_set()
            if fact.status >= 500 or said.status >= 500:
                time.sleep(0.1)

    writers = [threading.Thread(target=write, args=(n,)) for n in (1, 2)]
    for t in writers:
        t.start()
    time.sleep(2.0)
    pair.primary.kill()
    pair.standby.promote()
    with pair.standby.connect() as conn:  # (its own standby, none yet: see the docs)
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
        conn.execute("SELECT pg_reload_conf()")
    switched.set()
    for t in writers:
        t.join()
    print(f"facts acknowledged {len(facts)}, messages {len(messages)}")
    assert after[0] >= 60  # writes reached the promoted server by themselves
    with pair.standby.connect() as conn:
        kept_facts = {str(r[0]) for r in conn.execute(
            "SELECT id FROM memories_fact WHERE id::text = ANY(%s)", [facts])}  # fmt: skip
        kept_messages = {r[0] for r in conn.execute(
            "SELECT id FROM ingestion_message WHERE id = ANY(%s)", [messages])}  # fmt: skip
    assert kept_facts == set(facts) and len(facts) > 20
    assert kept_messages == set(messages) and len(messages) > 60
