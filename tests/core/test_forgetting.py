"""Forgetting, proven (issue 27, item 4): an end user given every kind of memory, each
text carrying a marker of theirs, is erased the way a client erases one; then every
table of the database (each text, JSON, array, ``tsvector`` and ``bytea`` column, the
keyword statistics' lexemes included) and every file of the service's storage is
scanned for the marker: nothing is left, and another end user of the same owner,
given the same memories with a marker of their own, is found exactly where they were.

The marker is looked for as written, as the stemmed lexemes full-text search keeps of
it, and base64-encoded (django-q2 keeps a task's arguments pickled in base64 text)."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from django_q.tasks import async_task

from core.models import AccessEvent, APIKey, UsageDay
from ingestion.updates import updates_run
from memories.bases.services import memory_base_create, memory_base_flush
from memories.conversations.models import ConversationSummary, Flow
from memories.conversations.node_memory import LATEST, node_memory_append_turn
from memories.engine.dreams import dream_run
from memories.facts.scopes import scope_find
from memories.facts.services import FactIn, fact_add, fact_delete, fact_update
from memories.stores.config import memory_config_apply
from memories.stores.runtime import node_memory_write
from tests.fakes.openai_server import Scripted, chat_body

pytestmark = pytest.mark.django_db(transaction=True)

ERIN, OTHER = "erin", "other"
MARKERS = {ERIN: "zqxerinmarkers", OTHER: "zqxothermarkers"}  # stemmed: ...mark
NODE = "answer"
LONG = "It has a long history, told at length, with many turns and names and dates. " * 2


# --- the scripted LLM ---------------------------------------------------------------
def _marker_in(text: str) -> str:
    (marker,) = [m for m in MARKERS.values() if m in text]  # prompts never mix two users
    return marker


def _dream_facts(prompt: str) -> list[dict[str, Any]]:
    """Every fact of the prompt's MEMORY.md kept (``- [0.90] text (id: <id>)``)."""
    kept = []
    for line in prompt.splitlines():
        if line.startswith("- [") and line.endswith(")") and "(id: " in line:
            text, _, fact_id = line[line.index("] ") + 2 : -1].rpartition(" (id: ")
            kept.append({"id": fact_id, "content": text})
    return kept


def llm(payload: dict[str, Any]) -> Scripted:
    """Extraction learns a fact, a dream keeps every fact and learns one, a summary and
    a chat answer repeat the marker: every text the service writes carries it."""
    prompt = "\n".join(str(m.get("content")) for m in payload.get("messages", []))
    marker = _marker_in(prompt)
    if "You maintain the long-term memory" in prompt:
        fact = {"content": f"User collects {marker} stamps", "category": "preference",
                "confidence": 0.9}  # fmt: skip
        answer: Any = {"newFacts": [fact], "factsToRemove": []}
    elif "deep dream" in prompt:
        answer = {
            "facts": [*_dream_facts(prompt), {"id": None, "content": f"User dreams of {marker}",
                                               "category": "goal", "confidence": 0.8}],
            "diary": f"Learned that the user dreams of {marker}.",
        }  # fmt: skip
    elif "summary" in prompt.lower() and "conversation" in prompt.lower():
        answer = f"The user talked about {marker} at length."
    else:
        answer = f"Noted: {marker} it is."
    return Scripted(body=chat_body(answer if isinstance(answer, str) else json.dumps(answer)))


# --- populating -----------------------------------------------------------------------
@pytest.fixture
def storage(tmp_path, settings, llm_settings, openai_server) -> Path:
    """The service's storage (journals, MEMORY.md, diaries and node memory all go
    through the default storage) in a directory of the test's own."""
    root = tmp_path / "storage"
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(root)},
    }}  # fmt: skip
    settings.ENGINE_STORAGE = "default"
    settings.NODE_MEMORY_STORAGE = "default"
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 30  # flushes wait on the scope's schedule
    openai_server.chat_fn = llm
    return root


def _chat(client, user: str, text: str) -> None:
    answer = client.post(
        "/v1/chat/completions",
        {"model": "fake-model", "messages": [{"role": "user", "content": text}]},
        format="json", HTTP_X_OPENWEBUI_USER_ID=user, HTTP_X_OPENWEBUI_CHAT_ID=f"chat-{user}",
    )  # fmt: skip
    assert answer.status_code == 200, answer.content


def _populate(owner, client, user: str) -> None:
    """Every kind of memory of ``user`` (before the owner's memory base and stores,
    which ``_populate_shared`` adds over both users' chats)."""
    m = MARKERS[user]
    scope = ("user", user)
    # Personal facts with history: an edit closes a version, a deletion another.
    added = fact_add(owner=owner, scope=scope, reason="seed", facts=[
        FactIn(f"User keeps a notebook named {m}"), FactIn(f"User's locker code is {m}"),
    ])  # fmt: skip
    fact_update(owner=owner, fact_id=added[0].fact_id, scope=scope,
                content=f"User keeps two notebooks named {m}", reason=f"corrected {m}")  # fmt: skip
    fact_delete(owner=owner, fact_id=added[1].fact_id, scope=scope, reason=f"forget {m}")
    # Messages through the chat proxy (a recorded chat; each turn's learning is a task,
    # run at once here), and a turn whose learning is still queued for a worker.
    _chat(client, user, f"My pen pal is called {m}.")
    _chat(client, user, f"Tell me more about {m}, please.")
    async_task("ingestion.tasks.form_memories", owner.pk, user, f"Queued: {m}.",
               timezone.now().isoformat(), "", task_name="form-memories", sync=False)  # fmt: skip
    # A flush through the API, run: facts learned, a formation run, a journal day.
    flushed = client.post("/api/v1/engine/flush", {"scope": list(scope), "messages": [
        {"role": "user", "content": f"I collect {m} stamps."},
        {"role": "assistant", "content": f"Lovely, {m} stamps."},
    ]}, format="json")  # fmt: skip
    assert flushed.status_code == 202, flushed.content
    run = updates_run(scope_id=scope_find(owner=owner, scope=scope).pk, force=True)
    assert run.status == "done", run
    # ... and one left pending at the erasure.
    client.post("/api/v1/engine/flush", {"scope": list(scope), "messages": [
        {"role": "user", "content": f"Remind me about {m} tomorrow."}]}, format="json")  # fmt: skip
    # A dream: its row, MEMORY.md and the diary.
    assert not dream_run(owner=owner, scope=scope, lookback_days=2).skipped
    # Running summaries: of a conversation the client sends, and of the recorded chat.
    for body in (
        {"conversation_id": "c1", "messages": [
            {"id": "1", "role": "user", "content": f"Let me tell you all about {m}: {LONG}"},
            {"id": "2", "role": "assistant", "content": f"Please do, {m} sounds fine. {LONG}"},
            {"id": "3", "role": "user", "content": "Go on."}]},
        {"conversation": {"flow": str(Flow.objects.get(owner=owner, name="chat-proxy").pk),
                          "session_id": f"chat-{user}"}},
    ):  # fmt: skip
        folded = client.post("/api/v1/engine/summaries", {
            "scope": list(scope), "max_tokens": 40, "max_summary_tokens": 20, **body,
        }, format="json")  # fmt: skip
        assert folded.status_code == 200, folded.content
    # (stored whole; an answer's summary is cut to the room its kept messages leave)
    stored = ConversationSummary.objects.filter(owner=owner).values_list("text", flat=True)
    assert sum(m in text for text in stored) == 2  # (the chat's and the client's, of this user)


def _populate_shared(owner, users: list[str]) -> None:
    """What the owner's flow of proxied chats feeds per chat: a memory base's chunks, two
    memory stores' items and a node memory document, for each user's chat."""
    flow = Flow.objects.get(owner=owner, name="chat-proxy")
    memory_base = memory_base_create(owner=owner, name="chats", flow=flow, threshold=1)
    memory_base_flush(memory_base=memory_base)
    memory_config_apply(owner=owner, document={
        "memory": [{"name": "notes", "type": "simple", "config": {}},
                   {"name": "board", "type": "blackboard", "config": {}}],
        "nodes": [{"id": NODE, "flow": flow.name,
                   "memories": [{"name": "notes"}, {"name": "board"}]}],
    })  # fmt: skip
    for user in users:
        m, chat = MARKERS[user], f"chat-{user}"
        node_memory_write(flow=flow, node_id=NODE, session_id=chat,
                          input=f"What is {m}?", output=f"{m} is the user's pen pal, it seems.",
                          metadata={"topic": m})  # fmt: skip
        node_memory_append_turn(flow=flow, session_id=chat, node_id=NODE, message_id="t1",
                                parent_message_id=LATEST, user_content=f"Who is {m}?",
                                assistant_content=f"{m} is your pen pal.")  # fmt: skip


# --- scanning -------------------------------------------------------------------------
def _needles(marker: str) -> list[str]:
    """The marker, the lexemes full-text search keeps of it, and its base64 forms."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT u.lexeme FROM unnest(ARRAY['english', 'simple']::regconfig[]) c, "
            "unnest(to_tsvector(c, %s)) u",
            [marker],
        )
        lexemes = [row[0] for row in cur.fetchall()]
    assert lexemes and any(lexeme != marker for lexeme in lexemes)  # a stem differs
    return sorted({marker, *lexemes, *_base64_forms(marker)})


def _base64_forms(marker: str) -> list[str]:
    """The marker's bytes in base64 (standard and URL-safe: django-q2 signs its queue's
    payloads with the latter) at each of the three offsets a text can put it at: the
    characters only its own bytes determine."""
    forms = []
    for offset in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"\0" * offset + marker.encode()).decode()
            forms.append(encoded[4 if offset else 0 : 4 * ((offset + len(marker)) // 3)])
    return forms


TEXT_TYPES = {"text", "character varying", "character", "json", "jsonb", "tsvector", "ARRAY",
              "xml", "name"}  # fmt: skip
NOT_TEXT = {"vector", "halfvec", "sparsevec"}


def _columns() -> list[tuple[str, str, str]]:
    """(table, column, how it is searched) of every column that can hold the marker, in
    every table of the schema."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.table_name, c.column_name, c.data_type, c.udt_name "
            "FROM information_schema.columns c JOIN information_schema.tables t "
            "ON t.table_schema = c.table_schema AND t.table_name = c.table_name "
            "WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' "
            "ORDER BY 1, 2"
        )
        rows = cur.fetchall()
    out = []
    for table, column, data_type, udt in rows:
        if data_type == "bytea":
            out.append((table, column, "bytea"))
        elif data_type in TEXT_TYPES or (data_type == "USER-DEFINED" and udt not in NOT_TEXT):
            out.append((table, column, "text"))
    return out


def db_hits(marker: str) -> dict[str, int]:
    """``table.column`` -> the rows holding the marker (in any of its forms)."""
    needles = _needles(marker)
    hits = {}
    quote = connection.ops.quote_name
    with connection.cursor() as cur:
        for table, column, kind in _columns():
            if kind == "bytea":
                value, params = quote(column), [n.encode() for n in needles]
            else:
                value, params = f"{quote(column)}::text", list(needles)
            where = " OR ".join(f"position(%s IN {value}) > 0" for _ in needles)
            cur.execute(f"SELECT count(*) FROM {quote(table)} WHERE {where}", params)
            count = cur.fetchone()[0]
            if count:
                hits[f"{table}.{column}"] = count
    return hits


def file_hits(root: Path, marker: str) -> list[str]:
    """The files under ``root`` holding the marker (gzipped ones read unzipped)."""
    needles = [n.encode() for n in _needles(marker)]
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        if any(n in data for n in needles) or marker in str(path):
            found.append(str(path.relative_to(root)))
    return found


# --- the test ---------------------------------------------------------------------------
# Where each kind of memory lands: the scan finds the marker there before the erasure
# (or it would prove nothing).
POPULATED = {
    "memories_fact.content",  # facts
    "memories_fact.search_vector",  # their keyword lexemes
    "memories_factversion.content",  # closed versions (the edit, the deletion)
    "memories_factchange.old_content",  # the audit trail
    "ingestion_message.text",  # the chats the proxy recorded
    "django_q_task.args",  # the proxy's learning tasks, run
    "django_q_ormq.payload",  # ... and one still queued
    "memory_engine_pendingupdate.messages",  # flushes, done and pending
    "memory_engine_dream.diary",
    "memory_engine_dream.facts_before",
    "conversations_conversationsummary.text",  # of a client's conversation and a chat
    "knowledge_chunk.text",  # the memory base's chunks of the chats
    "knowledge_chunk.search_vector",
    "knowledge_term_stats.lexeme",  # keyword statistics: the stem only
    "memory_stores_memoryitem.content_summary",
    "memory_stores_memoryitem.search_vector",
}
FOLDERS = {"journal", "memory", "dreams", "node_memory"}  # days, MEMORY.md, diaries, nodes


@pytest.mark.parametrize("door", ["users", "engine"])
def test_erasing_an_end_user_leaves_no_trace_of_them(alice, alice_client, storage, door):
    for user in (ERIN, OTHER):
        _populate(alice, alice_client, user)
    _populate_shared(alice, [ERIN, OTHER])
    erins, others = db_hits(MARKERS[ERIN]), db_hits(MARKERS[OTHER])
    erins_files = file_hits(storage, MARKERS[ERIN])
    others_files = file_hits(storage, MARKERS[OTHER])
    assert POPULATED <= set(erins) and set(erins) == set(others)
    assert {f.split("/")[0] for f in erins_files} == FOLDERS
    assert len(erins_files) == len(others_files)

    if door == "users":
        erased = alice_client.delete(f"/api/v1/users/{ERIN}/memories")
    else:
        erased = alice_client.post("/api/v1/engine/erase", {"scope": ["user", ERIN]}, format="json")

    assert erased.status_code == 200, erased.content
    assert erased.json()["facts_removed"] == 3  # the edited one, the learned, the dreamt
    assert db_hits(MARKERS[ERIN]) == {}
    assert file_hits(storage, MARKERS[ERIN]) == []
    # Nothing of the other end user went: the same rows, the same files.
    assert db_hits(MARKERS[OTHER]) == others
    assert file_hits(storage, MARKERS[OTHER]) == others_files
    # What stays: one content-free event of the erasure in the audit trail of access (who
    # asked, with which key, from where, when, the kind of scope, the counts), never the
    # end user's id.
    (record,) = AccessEvent.objects.filter(action="erasure")
    (key,) = APIKey.objects.filter(owner=alice)
    assert (record.owner, record.actor, record.key_id, record.subject_key_id,
            record.address) == (alice, f"key:{key.prefix}", key.pk, None, "127.0.0.1")  # fmt: skip
    assert set(record.detail) == {"scope_kind", "counts"}
    assert record.detail["scope_kind"] == "user"
    counts = record.detail["counts"]
    assert counts == {"facts": 3, "versions": counts["versions"],
                      "changes": counts["changes"], "chats": 1}  # fmt: skip
    assert counts["versions"] >= 2 and counts["changes"] >= 4
    assert ERIN not in json.dumps(record.detail) + record.actor
    # The usage counts of their chats, extractions, dreams and summaries stay (the owner's
    # bill), under no end user's id.
    subjects = set(UsageDay.objects.values_list("subject", flat=True))
    assert {"(erased)", f"user/{OTHER}"} <= subjects and f"user/{ERIN}" not in subjects
