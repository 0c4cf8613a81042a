"""Databases made by older code keep every row through ``manage.py migrate`` on today's
code, readable through today's models under today's names:

- ``schema_020021f.sql``: the layout before issue 10 (``make_upgrade_dump.py``);
- ``schema_c246bc8.sql``: ``main`` before the facts room (issue 22), rows in every
  table (``make_upgrade_dump_c246bc8.py``).

Later migrations are covered by the same tests: both dumps migrate to head.
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

from core.db_backend.base import embedded_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "upgrade"
PSQL = Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"

# Tables renamed in place since the dumps were made: old name -> today's.
RENAMED = {
    "memories_enduser": "memories_scope",
    "memories_vector": "memories_fact",
    "memories_vector_half": "memories_fact_half",
    "memories_uservector": "memories_factlink",
    "memories_memoryupdate": "memories_factchange",
    "memories_metriccounter": "core_metriccounter",
}
# Tables that may gain rows: schedules, content types and permissions (created after
# every migrate); each owner's global memories get their scope, its links and their
# 16-bit copies (memories 0013). The counters are checked by name (some are folded).
GROW = ("django_q_schedule", "django_content_type", "auth_permission", "memories_scope",
        "memories_factlink", "memories_fact_half", "core_metriccounter")  # fmt: skip


def _dump_counts(dump: Path) -> dict[str, int]:
    text = dump.read_text()
    blocks = re.finditer(r"^COPY public\.(\w+) .*?FROM stdin;\n(.*?)^\\\.$", text, re.S | re.M)
    return {m.group(1): m.group(2).count("\n") for m in blocks}


def _admin(sql: str) -> None:
    db = settings.DATABASES["default"]
    embedded_server(db)  # its HOST and PORT are filled on a process's first connection
    with psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db.get("OWNER_USER") or db["USER"],
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(sql)


def _run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.fixture
def migrated():
    """``migrated(dump)``: the dump loaded into a database of its own, migrated with
    today's code; answers (row counts of the dump, what ``check_upgrade.py`` reads)."""
    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs against the embedded server; DATABASE_URL is set")
    made: list[str] = []
    db = settings.DATABASES["default"]
    embedded_server(db)

    def load(name: str) -> tuple[dict[str, int], dict]:
        dump = FIXTURES / f"schema_{name}.sql"
        dbname = f"upgrade_{uuid.uuid4().hex[:8]}"
        _admin(f'CREATE DATABASE "{dbname}"')
        made.append(dbname)
        subprocess.run(
            [str(PSQL), "-q", "-v", "ON_ERROR_STOP=1", "-h", db["HOST"], "-p", str(db["PORT"]),
             "-U", db.get("OWNER_USER") or db["USER"], "-d", dbname, "-f", str(dump)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        env = {
            k: v for k, v in os.environ.items() if k not in {"TESTING", "DJANGO_SETTINGS_MODULE"}
        }
        env.update(EMBEDDED_DB_NAME=dbname, EMBEDDING_PROVIDER="hashing")
        _run(["manage.py", "migrate", "--no-input"], env)
        return _dump_counts(dump), json.loads(_run([str(FIXTURES / "check_upgrade.py")], env))

    yield load
    for dbname in made:
        _admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _every_row_kept(before: dict[str, int], state: dict) -> None:
    """Every table of the old schema is there under today's name with every row (the
    GROW tables may gain rows), and reads through today's models."""
    for table, count in before.items():
        if table == "django_migrations":
            continue
        today = RENAMED.get(table, table)
        if today == "core_metriccounter":
            continue
        assert state["tables"][today] >= count, table
        if today not in GROW:
            assert state["tables"][today] == count, table
    for label, model in state["models"].items():
        assert len(model["rows"]) == state["tables"][model["table"]], label


def _derived_tables_agree(state: dict) -> None:
    """What the triggers keep (each scope's counts, the 16-bit copies) agrees with the
    rows, and the triggers are today's."""
    for path, fact_count, links, text_facts, own in state["scope_counts"]:
        assert (fact_count, text_facts) == (links, own), path
    assert all(same and scope for _, same, scope in state["fact_half"])
    assert state["triggers"] == sorted(
        [
            f"memories_{prefix}_{op}"
            for prefix in ("fact_half", "fact_text_stats", "factlink_count")
            for op in ("delete", "insert", "truncate", "update")
        ]
        # each row's owner, from its parent (row-level security: core.row_security)
        + ["memories_fact_half_owner", "memories_factchange_owner", "memories_factlink_owner"]
    )


def test_020021f_keeps_every_row(migrated):
    before, state = migrated("020021f")
    _every_row_kept(before, state)
    _derived_tables_agree(state)
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
    facts = {r["content"]: r for r in models["memories.Fact"]["rows"]}
    assert sorted(facts) == ["Be concise", "Carol likes coffee", "Carol likes tea"]
    # The one linked fact is shared by two users (no scope of its own): no 16-bit copy
    # (memories 0008); the global memory is now a fact of alice's global scope (0013).
    scopes = {r["id"]: r for r in models["memories.Scope"]["rows"]}
    glob = facts["Be concise"]["scope_id"]
    assert scopes[glob]["path"] == "[]" and scopes[glob]["external_id"] == "None"
    assert [facts[c]["scope_id"] for c in ("Carol likes coffee", "Carol likes tea")] == ["None"] * 2
    assert [row[0] for row in state["fact_half"]] == ["Be concise"]
    assert sorted(r["path"] for r in scopes.values()) == sorted(
        ["[]", "['user', 'carol']", "['user', 'dave']"]
    )
    assert all(r["tokens"] != "None" for r in facts.values())  # counted by 0014
    counters = {r["name"]: r["value"] for r in models["core.MetricCounter"]["rows"]}
    assert counters == {"memory_additions_total": "7", "engine_llm_calls_total": "3"}
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


FACT = {n: str(uuid.UUID(int=n)) for n in range(1, 6)}  # make_upgrade_dump_c246bc8.FACT_IDS


def test_c246bc8_keeps_every_row_under_its_new_name(migrated):
    before, state = migrated("c246bc8")
    assert all(count > 0 for table, count in before.items()), "a table of the dump is empty"
    _every_row_kept(before, state)
    _derived_tables_agree(state)
    models = state["models"]
    scopes = {r["path"]: r for r in models["memories.Scope"]["rows"]}
    assert sorted(scopes) == sorted(
        ["[]", "['org', 'acme']", "['user', 'carol']", "['user', 'dave']"]
    )
    assert (scopes["['user', 'carol']"]["external_id"], scopes["['org', 'acme']"]["external_id"]) == ("carol", "None")  # fmt: skip
    assert scopes["['user', 'carol']"]["last_seen_at"].startswith("2026-01-02 03:04:05")
    carol, org, glob = (scopes[p]["id"] for p in ("['user', 'carol']", "['org', 'acme']", "[]"))
    facts = {r["id"]: r for r in models["memories.Fact"]["rows"]}
    assert set(facts) == {FACT[1], FACT[2], FACT[3], FACT[4]}
    own, shared, global_, team = (facts[FACT[n]] for n in (1, 2, 3, 4))
    assert (own["content"], own["scope_id"], own["category"], own["confidence"]) == (
        "Carol likes coffee", carol, "preference", "0.95",
    )  # fmt: skip
    assert (own["source_kind"], own["metadata"]) == ("message", "{'source': 'chat'}")
    assert (team["scope_id"], team["category"], team["source_ref"]) == (org, "goal", "2026-01-01")
    assert (shared["scope_id"], global_["scope_id"]) == ("None", glob)
    assert all(f["tokens"] not in ("None", "0") for f in facts.values())
    links = sorted(
        (r["scope_id"], r["fact_id"], r["shared"]) for r in models["memories.FactLink"]["rows"]
    )
    assert links == sorted([
        (carol, FACT[1], "False"), (carol, FACT[2], "True"),
        (scopes["['user', 'dave']"]["id"], FACT[2], "True"), (org, FACT[4], "False"),
        (glob, FACT[3], "False"),
    ])  # fmt: skip
    changes = sorted((r["action"], r["scope_id"], r["old_fact_id"], r["new_fact_id"])
                     for r in models["memories.FactChange"]["rows"])  # fmt: skip
    assert changes == [
        ("add", carol, "None", FACT[1]), ("evict", org, FACT[4], "None"),
        ("replace", carol, FACT[5], FACT[1]),
    ]  # fmt: skip
    assert sorted(row[0] for row in state["fact_half"]) == [
        "Acme ships on Fridays", "Be concise", "Carol likes coffee",
    ]  # fmt: skip
    counters = {r["name"]: r["value"] for r in models["core.MetricCounter"]["rows"]}
    assert counters == {
        "memory_additions_total": "7", "memory_dedup_total": "4",
        "engine_llm_calls_total": "3", "engine_llm_tokens_total": "420",
        "engine_llm_malformed_total": "1", "engine_update_runs_total": "7",  # 5 + 2 formation runs
    }  # fmt: skip
    pending = sorted(
        (r["scope_id"], r["status"]) for r in models["memory_engine.PendingUpdate"]["rows"]
    )
    assert pending == [(carol, "done"), (carol, "pending")]
    (dream,) = models["memory_engine.Dream"]["rows"]
    assert (dream["scope_id"], dream["diary"]) == (org, "slept well")
    assert models["memory_engine.EngineSettings"]["rows"][0]["dream_schedule"] == "False"
    assert len(models["memory_stores.MemoryItem"]["rows"]) == 1
    assert models["conversations.ConversationSummary"]["rows"][0]["text"] == "Carol said hi."
    # Content types were renamed with their models (same rows: the admin log still
    # points at the global memory), and the permissions with them.
    assert {"memories.view_fact", "memories.change_scope", "memories.view_factchange",
            "memory_bases.view_memorybase"} <= set(state["bob_permissions"])  # fmt: skip
    assert not any(p.split(".")[1].endswith(("_vector", "_enduser", "_memoryupdate"))
                   for p in state["bob_permissions"])  # fmt: skip
    kinds = {ct.rsplit(":", 1)[0] for ct in state["content_types"]}
    assert {"memories.fact", "memories.scope", "memories.factlink", "memories.factchange",
            "core.metriccounter"} <= kinds  # fmt: skip
    assert not {"memories.vector", "memories.enduser", "memories.metriccounter"} & kinds
    assert sorted(state["admin_log"]) == sorted(
        [f"memory_bases.memorybase:{models['memory_bases.MemoryBase']['rows'][0]['id']}",
         f"memories.fact:{FACT[3]}"]
    )  # fmt: skip
