"""Reads from a streaming replica with read-your-writes (issue 28, item 1; ``core.replicas``).

A primary and a real standby (``tests.pg_cluster``: the embedded PostgreSQL's binaries,
``pg_basebackup -R``), the standby replaying WAL a second late on purpose
(``recovery_min_apply_delay``). Two web hosts (``manage.py serve --no-worker``, each a
process tree of its own) run on them with ``DATABASE_URL`` the primary and
``DATABASE_REPLICA_URLS`` the standby; ``REPLICA_MAX_LAG_SECONDS`` is 30 on the
relaxed one and 0.2 on the strict one.

- Writers add a fact through the strict host and search for it at once through the
  relaxed one, 1,000 times: every search finds its fact (the standby, a second behind,
  cannot have it: the read goes to the primary).
- Meanwhile an owner who does not write searches its own facts through the relaxed host:
  those reads go to the standby (``X-Read-From: replica``), counted, and answer right.
- The strict host skips the standby while it lags more than 0.2 s.
- The standby stopped: reads still answer 200, from the primary; started again, they
  return to it.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.replicas import RETRIED
from scripts.faults.harness import Instance, free_port
from tests.pg_cluster import Pair, start_pair

pytestmark = pytest.mark.slow

WRITERS = 4
ROUNDS = 250  # per writer: 1,000 writes each read back at once
SCOPE = ["org", "replicas"]
# Each fact is six of these and a token of its own: no two are near-duplicates.
WORDS = (
    "amber basil cedar delta ember fjord garnet harbor iris juniper kelp lantern meadow "
    "nectar orchid pepper quartz raven saffron thistle umber velvet willow yarrow zinnia "
    "anvil bramble copper dune falcon glacier hazel indigo jasper kettle lagoon marble "
    "nutmeg onyx prairie quill ripple sierra tundra ursa vortex walnut xenon yonder"
).split()


def _url(server: Any, dbname: str) -> str:
    return f"postgresql://postgres@{urllib.parse.quote(str(server.socket_dir), safe='')}:{server.port}/{dbname}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Pair, list[Instance]]]:
    port = free_port()
    pair = start_pair(synchronous=False, port=port,
                      standby_settings=("recovery_min_apply_delay = '1s'", "hot_standby_feedback = on"))  # fmt: skip
    hosts: list[Instance] = []
    try:
        with pair.primary.connect() as conn:
            conn.execute("CREATE DATABASE memory")
        for max_lag in ("30", "0.2"):
            host = Instance(env_overrides={
                "DATABASE_URL": _url(pair.primary, "memory"),
                "DATABASE_REPLICA_URLS": _url(pair.standby, "memory"),
                "REPLICA_MAX_LAG_SECONDS": max_lag,
            })  # fmt: skip
            if not hosts:
                host.manage("migrate", "--no-input")
            host.start("serve", "--no-worker", "--web-workers", "2")
            host.wait_healthy(worker=False)
            hosts.append(host)
        yield pair, hosts
    finally:
        for host in hosts:
            host.stop()
            host.destroy()
        pair.stop()


def _client(host: Instance, key: str) -> httpx.Client:
    return httpx.Client(base_url=host.base_url, timeout=30,
                        headers={"Authorization": f"Bearer {key}"})  # fmt: skip


def _add(client: httpx.Client, text: str) -> str:
    reply = client.post("/api/v1/engine/facts", json={"scope": SCOPE, "content": text})
    assert reply.status_code == 201, reply.text
    return reply.json()["fact"]["id"]


def _search(client: httpx.Client, query: str) -> tuple[list[str], str]:
    reply = client.post("/api/v1/engine/search", json={"scope": SCOPE, "query": query, "limit": 5})
    assert reply.status_code == 200, reply.text
    return [hit["id"] for hit in reply.json()["results"]], reply.headers.get("X-Read-From", "")


def _read_caught_up(pair: Pair, reads: httpx.Client, query: str) -> str:
    """Where a search right after the standby caught up was read. The workers' own writes
    (their heartbeats and liveness beats, every few seconds) put the delayed standby a
    second behind again now and then: a few tries, each after it caught up."""
    source = ""
    for _ in range(20):
        _wait_replayed(pair)
        source = _search(reads, query)[1]
        if source == "replica":
            break
        time.sleep(0.25)
    return source


def _said(host: Instance) -> list[str]:
    """What the host logged about its replicas."""
    return [line[:400] for line in host.log().splitlines() if "replica" in line or "Error" in line][
        -20:
    ]


def _wait_replayed(pair: Pair) -> None:
    """Until the standby has replayed everything the primary has written."""
    with pair.primary.connect() as primary, pair.standby.connect() as standby:
        (target,) = primary.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (done,) = standby.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [str(target)]
            ).fetchone()
            if done:
                return
            time.sleep(0.1)
    raise AssertionError("the standby did not catch up")


def test_every_search_sees_its_write_and_other_owners_read_the_replica(cluster):
    pair, (relaxed, strict) = cluster
    reader_key = relaxed.key_for("replica-reader")
    with _client(strict, reader_key) as reader:
        own = [
            _add(reader, f"The reader's note number {i} is about lighthouses.") for i in range(3)
        ]
    _wait_replayed(pair)

    failures: list[str] = []
    sources: Counter[str] = Counter()
    done = threading.Event()

    def write_then_read(number: int) -> None:
        key = relaxed.key_for(f"replica-writer-{number}")
        words = random.Random(number)
        with _client(strict, key) as writes, _client(relaxed, key) as reads:
            for round_ in range(ROUNDS):
                text = " ".join(words.sample(WORDS, 6)) + f" zeta{number}x{round_}"
                fact = _add(writes, text)
                found, source = _search(reads, f"zeta{number}x{round_}")
                sources[f"writer {source}"] += 1
                if fact not in found:
                    failures.append(f"writer {number} round {round_}: {fact} not in {found}")

    def read_meanwhile() -> None:
        with _client(relaxed, reader_key) as reads:
            while not done.is_set():
                found, source = _search(reads, "lighthouses")
                sources[f"reader {source}"] += 1
                if set(found) != set(own):
                    failures.append(f"the reader found {found}, not {own}")

    writers = [threading.Thread(target=write_then_read, args=(n,)) for n in range(WRITERS)]
    reader = threading.Thread(target=read_meanwhile)
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    reader.join()

    print(dict(sources), *_said(relaxed), sep="\n")
    assert failures == []
    # A second behind, the standby has not replayed a write its writer reads at once: the
    # read goes to the primary. On a loaded machine a write's answer and the next read can
    # take longer than that second; such a read may go to the standby, and it finds its
    # fact there (failures above): read-your-writes holds either way.
    assert sources["writer primary"] >= 0.98 * WRITERS * ROUNDS
    # (a read the standby cancelled, a conflict with recovery, is answered from the primary;
    # when the standby closed the connection, the host also takes it for down a few seconds
    # and the reads of those seconds go to the primary: only after such a failure)
    allowed = {"writer primary", "writer replica", "reader replica", f"reader {RETRIED}"}
    if sources[f"reader {RETRIED}"] or sources[f"writer {RETRIED}"]:
        allowed |= {"reader primary", f"writer {RETRIED}"}
    assert set(sources) <= allowed, sources
    assert sources["reader replica"] > 0


def test_a_host_skips_a_replica_that_lags_more_than_it_allows(cluster):
    pair, (relaxed, strict) = cluster
    writer_key = relaxed.key_for("lag-writer")
    reader_key = relaxed.key_for("lag-reader")
    with _client(relaxed, reader_key) as reader:
        _add(reader, "The lag reader keeps one note about harbours.")
    with _client(strict, reader_key) as reads:
        assert _read_caught_up(pair, reads, "harbours") == "replica"  # caught up: no lag
        with _client(relaxed, writer_key) as writes:
            seen = []
            for i in range(10):  # a write every 0.1 s keeps the standby a second behind
                _add(writes, f"Lag writer entry {i} on tides.")
                time.sleep(0.1)
                seen.append(_search(reads, "harbours")[1])
    assert seen[-5:] == ["primary"] * 5, seen


def test_a_replica_that_stops_is_skipped_and_comes_back(cluster):
    pair, (relaxed, _) = cluster
    key = relaxed.key_for("replica-outage")
    with _client(relaxed, key) as client:
        fact = _add(client, "The outage note is about windmills.")
    _wait_replayed(pair)
    answers: list[tuple[int, str]] = []
    with _client(relaxed, key) as reads:

        def search() -> None:
            reply = reads.post("/api/v1/engine/search",
                               json={"scope": SCOPE, "query": "windmills", "limit": 5})  # fmt: skip
            hits = [h["id"] for h in reply.json().get("results", [])]
            answers.append((reply.status_code, reply.headers.get("X-Read-From", "")))
            assert hits == [fact], reply.text

        search()
        assert answers[-1] == (200, "replica")
        stopper = threading.Thread(target=pair.standby.stop)
        stopper.start()
        for _ in range(40):
            search()
        stopper.join()
        assert {status for status, _ in answers} == {200}, answers
        assert answers[-1] == (200, "primary")
        (down,) = relaxed.get("/healthz").body["replicas"]
        assert (down["alias"], down["status"]) == ("replica1", "down")
        pair.standby.start()
        deadline = time.monotonic() + 30
        while answers[-1][1] != "replica" and time.monotonic() < deadline:
            time.sleep(0.5)
            search()
    assert {status for status, _ in answers} == {200}
    assert answers[-1] == (200, "replica")
    (back,) = relaxed.get("/healthz").body["replicas"]
    assert back["status"] == "ok" and back["lag_seconds"] < 30, back
