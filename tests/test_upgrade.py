"""A database created by commit 020021f (the layout before issue 10) keeps every row
through ``manage.py migrate`` on today's code, readable through today's models.

The dump (``tests/fixtures/upgrade/schema_020021f.sql``, built by
``make_upgrade_dump.py`` next to it) has a few rows in every table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pgserver
import psycopg
import pytest
from django.conf import settings

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "upgrade"
DUMP = FIXTURES / "schema_020021f.sql"
PSQL = Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"


def _dump_counts() -> dict[str, int]:
    text = DUMP.read_text()
    blocks = re.finditer(r"^COPY public\.(\w+) .*?FROM stdin;\n(.*?)^\\\.$", text, re.S | re.M)
    return {m.group(1): m.group(2).count("\n") for m in blocks}


def _admin(sql: str) -> None:
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(sql)


@pytest.fixture
def upgraded_db():
    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs against the embedded server; DATABASE_URL is set")
    dbname = f"upgrade_{uuid.uuid4().hex[:8]}"
    db = settings.DATABASES["default"]
    _admin(f'CREATE DATABASE "{dbname}"')
    subprocess.run(
        [
            str(PSQL),
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            db["HOST"],
            "-p",
            str(db["PORT"]),
            "-U",
            db["USER"],
            "-d",
            dbname,
            "-f",
            str(DUMP),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    env = {k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}}
    env.update(EMBEDDED_DB_NAME=dbname, EMBEDDING_PROVIDER="hashing")
    yield dbname, env
    _admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_migrate_keeps_every_row(upgraded_db):
    _, env = upgraded_db
    before = _dump_counts()
    _run(["manage.py", "migrate", "--no-input"], env)
    state = json.loads(_run([str(FIXTURES / "check_upgrade.py")], env))

    # Every table of the old schema is still there with every row (schedules and
    # content types may gain rows, nothing loses any).
    for table, count in before.items():
        if table == "django_migrations":
            continue
        assert state["tables"][table] >= count, table
        if not table.startswith(("django_q_schedule", "django_content_type", "auth_permission")):
            assert state["tables"][table] == count, table
    # ... and read through today's models, with the old tables under them.
    for label, model in state["models"].items():
        assert len(model["rows"]) == before[model["table"]], label

    models = state["models"]
    messages = {r["text"]: r for r in models["conversations.Message"]["rows"]}
    assert messages["hello there"]["parent_id"] == messages["hi"]["id"]
    assert messages["second answer"]["parent_id"] == messages["hello there"]["id"]
    assert messages["hi"]["parent_id"] == "None"
    sessions = {r["session_id"]: r for r in models["memory_bases.MemoryBaseSession"]["rows"]}
    assert sessions["s1"]["cursor_message_id"] == messages["hello there"]["id"]
    assert sessions["s1"]["total_processed"] == "1"
    jobs = sorted(r["status"] for r in models["memory_bases.MemoryBaseJob"]["rows"])
    assert jobs == ["running", "succeeded"]
    assert sorted(r["content"] for r in models["memories.Vector"]["rows"]) == [
        "Be concise",
        "Carol likes coffee",
        "Carol likes tea",
    ]
    # The dump's one linked fact is shared by two users (no scope of its own): no 16-bit
    # copy (memories 0008); each user's row counts its one link (0009).
    vectors = models["memories.Vector"]["rows"]
    assert [r["scope_id"] for r in vectors] == ["None"] * 3
    assert state["vector_half"] == []
    assert state["fact_counts"] == [[1, 1], [1, 1]]
    counters = {r["name"]: r["value"] for r in models["memories.MetricCounter"]["rows"]}
    assert counters == {"memory_additions_total": "7", "memory_llm_calls_total": "3"}
    schedules = dict(state["schedules"])
    assert schedules["custom-user-schedule"] == "knowledge.tasks.index_pending_chunks"
    assert schedules["node-memory-cleanup"] == "ingestion.tasks.node_memory_cleanup"
    assert schedules["index-pending-chunks"] == "knowledge.tasks.index_pending_chunks"
    assert schedules["ingest-jobs-sweep"] == "knowledge.tasks.ingest_jobs_sweep"
    assert schedules["memory-base-jobs-sweep"] == "ingestion.tasks.memory_base_jobs_sweep"
    # Admin content types and permissions moved with the models (same rows).
    assert {
        "memory_bases.change_memorybasejob",
        "conversations.view_message",
        "memory_bases.view_memorybase",  # through bob's group
    } <= set(state["bob_permissions"])
    assert not any(p.startswith("ingestion.") for p in state["bob_permissions"])
    assert not any(ct.startswith("ingestion.") for ct in state["content_types"])
    assert state["admin_log"][0].startswith("memory_bases.memorybase:")
    # The job a dead worker left running can be resumed by the new sweep.
    running = [r for r in models["memory_bases.MemoryBaseJob"]["rows"] if r["status"] == "running"]
    assert running[0]["attempts"] == "0"
