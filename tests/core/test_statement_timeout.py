"""The web processes stop a statement after ``API_STATEMENT_TIMEOUT_SECONDS`` (issue 28,
item 4; ``core.db.limit_web_statements``): a request cannot hold a connection for
minutes. A served instance with a 1 s limit; the test holds a lock the requests need
(``LOCK TABLE`` from a connection of its own), so their statements wait past the limit:
a search and a write each answer 503 ``statement_timeout`` in the API's error shape and
change nothing, and once the lock is gone the same requests succeed. Other processes
(management commands, the worker) have no such limit."""

from __future__ import annotations

import threading

import psycopg
import pytest

from scripts.faults.harness import Instance

pytestmark = pytest.mark.slow
SCOPE = ["org", "timeouts"]


@pytest.fixture(scope="module")
def instance():
    inst = Instance(env_overrides={"API_STATEMENT_TIMEOUT_SECONDS": "1"})
    inst.start("serve", "--no-worker", "--web-workers", "1")
    try:
        inst.wait_healthy(worker=False)
        yield inst
    finally:
        inst.stop()
        inst.destroy()


def _facts(inst: Instance) -> int:
    return int(inst.query("SELECT count(*) FROM memories_fact")[0][0])


def test_a_statement_past_the_limit_is_a_503_that_changes_nothing(instance):
    added = instance.post("/api/v1/engine/facts", {"scope": SCOPE, "content": "Acme ships on Fridays."})  # fmt: skip
    assert added.status == 201, added.body
    before = _facts(instance)
    locked, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        assert instance.data_dir is not None
        pid = (instance.data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
        with psycopg.connect(host=pid[4], port=pid[3], user="postgres", dbname="memory") as conn:
            conn.execute("LOCK TABLE memories_fact IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(60)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert locked.wait(30)
        search = instance.post("/api/v1/engine/search", {"scope": SCOPE, "query": "ships"})
        write = instance.post("/api/v1/engine/facts", {"scope": SCOPE, "content": "Acme closes in August."})  # fmt: skip
    finally:
        release.set()
        holder.join()
    for reply in (search, write):
        assert reply.status == 503, reply.body
        assert reply.body["error"]["code"] == "statement_timeout"
        assert "(1 s a statement)" in reply.body["error"]["message"]
        assert "Retry-After" not in reply.headers
    assert _facts(instance) == before  # the refused write wrote nothing

    search = instance.post("/api/v1/engine/search", {"scope": SCOPE, "query": "ships"})
    assert search.status == 200 and [h["content"] for h in search.body["results"]] == ["Acme ships on Fridays."]  # fmt: skip


def test_other_processes_have_no_statement_limit(instance):
    out = instance.manage("shell", "-c", "from django.db import connection\n"
                          "with connection.cursor() as c:\n"
                          "    c.execute('SHOW statement_timeout'); print(c.fetchone()[0])")  # fmt: skip
    assert out.strip().splitlines()[-1] == "0"
