"""The read-replica router's decisions, in process (``core.replicas``; the real standby is
tests/core/test_replicas.py): nothing changes without replicas; with one, writes record
the owner's WAL position, reads say where they read, a server that is not a standby is
never read from, a split search's second leg reads where its request does, reads inside
a transaction stay on the primary, the settings name the variable they refuse, and
``/healthz`` reports each replica."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from core import replicas
from core.models import WritePosition
from knowledge.retrieval.db import at_once
from memoryproject.env import EnvError, database_from_url

SCOPE = ["org", "acme"]


@pytest.fixture
def one_replica(settings):
    """``replica1``: the test's own connection again (inside its transaction), which is
    not a standby."""
    connections["replica1"] = connections["default"]
    settings.DATABASE_REPLICAS = ["replica1"]
    yield "replica1"
    del connections["replica1"]


@pytest.mark.django_db
def test_without_replicas_nothing_is_recorded_or_said(alice_client):
    added = alice_client.post("/api/v1/engine/facts", {"scope": SCOPE, "content": "Acme ships on Fridays."}, format="json")  # fmt: skip
    found = alice_client.post("/api/v1/engine/search", {"scope": SCOPE, "query": "ships"}, format="json")  # fmt: skip
    assert (added.status_code, found.status_code) == (201, 200)
    assert replicas.HEADER not in added and replicas.HEADER not in found
    assert WritePosition.objects.count() == 0


@pytest.mark.django_db
def test_a_write_records_its_position_and_a_read_skips_a_server_that_is_no_standby(
    one_replica, alice, alice_client, bob_client
):
    with connections["default"].cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        (before,) = cur.fetchone()
    added = alice_client.post("/api/v1/engine/facts", {"scope": SCOPE, "content": "Acme ships on Fridays."}, format="json")  # fmt: skip
    assert added.status_code == 201 and replicas.HEADER not in added
    position = WritePosition.objects.get()
    assert position.owner_id == alice.pk and position.lsn >= before

    refused = bob_client.post("/api/v1/engine/facts", {"scope": "org"}, format="json")
    assert refused.status_code == 400
    assert WritePosition.objects.count() == 1  # a refused request wrote nothing

    found = alice_client.post("/api/v1/engine/search", {"scope": SCOPE, "query": "ships"}, format="json")  # fmt: skip
    listed = alice_client.get("/api/v1/engine/facts?scope=org&scope=acme")
    assert found.status_code == 200 and found[replicas.HEADER] == "primary"
    assert [h["content"] for h in found.json()["results"]] == ["Acme ships on Fridays."]
    assert listed.status_code == 200 and listed[replicas.HEADER] == "primary"


def test_a_split_search_reads_both_legs_where_its_request_does():
    token = replicas._reads.set(replicas._Reads(read_only=True, alias="replica1"))
    try:

        def where() -> tuple[str, str]:
            return replicas.read_alias(), threading.current_thread().name

        here, there = at_once([where, where])
    finally:
        replicas._reads.reset(token)
    assert here == ("replica1", threading.current_thread().name)
    assert there[0] == "replica1" and there[1].startswith("search-leg")
    assert replicas.read_alias() == "default"  # and nothing is left behind


@pytest.mark.django_db(transaction=True)
def test_reads_inside_a_transaction_stay_on_the_primary():
    token = replicas._reads.set(replicas._Reads(read_only=True, alias="replica1"))
    try:
        assert replicas.read_alias() == "replica1"
        with transaction.atomic():
            assert replicas.read_alias() == "default"
            assert replicas.ReplicaRouter().db_for_read(WritePosition) is None
        assert replicas.ReplicaRouter().db_for_read(WritePosition) == "replica1"
        assert replicas.ReplicaRouter().db_for_write(WritePosition) == "default"
    finally:
        replicas._reads.reset(token)
    assert replicas.ReplicaRouter().allow_migrate("replica1", "core") is False
    assert replicas.ReplicaRouter().allow_migrate("default", "core") is True


@pytest.mark.django_db
def test_a_write_outside_a_request_is_recorded_at_once(one_replica, alice):
    token = replicas._reads.set(replicas._Reads())
    try:
        replicas.wrote(alice.pk)  # inside a request: the middleware records it at the end
    finally:
        replicas._reads.reset(token)
    assert WritePosition.objects.count() == 0
    replicas.wrote(alice.pk)  # a streamed turn, after the middleware answered
    assert list(WritePosition.objects.values_list("owner_id", flat=True)) == [alice.pk]


def test_a_bad_replica_url_names_its_variable():
    with pytest.raises(EnvError, match=r"^DATABASE_REPLICA_URLS: 'h2:x' is not host\[:port\]"):
        database_from_url("postgresql://h1:5432,h2:x/db", conn_max_age=0, name="DATABASE_REPLICA_URLS")  # fmt: skip


@pytest.mark.django_db
def test_healthz_reports_each_replica_and_stays_ok_without_one(
    one_replica, alice_client, anon_client
):
    full = alice_client.get("/healthz").json()
    assert full["replicas"] == [{"alias": "replica1", "status": "not_standby", "lag_seconds": None}]
    public = anon_client.get("/healthz").json()
    assert "replicas" not in public  # (the deployment's layout is for a key or staff)
    assert public["status"] == full["status"]  # a replica's trouble degrades nothing


def test_a_summarized_history_reads_from_the_primary():
    """A GET with strategy=summarize advances the running summary (a conditional update
    of the version it read): read on a replica behind, it would retry against a stale
    version. The tools, which may write, read from the primary as well."""
    from django.test import RequestFactory
    from django.urls import resolve

    def read(path):
        return replicas._is_read_view(RequestFactory().get(path), resolve(path.split("?")[0]).func)

    history = "/api/v1/conversations/s1/history?flow=x"
    node = "/api/v1/conversations/s1/nodes/n1/history?flow=x"
    assert read(history) and read(node) and read(history + "&strategy=truncate")
    assert not read(history + "&strategy=summarize") and not read(node + "&strategy=summarize")
