"""Node memory: turns, threads, budget, files, isolation, concurrency, clear, cleanup,
gzip, configuration, tenancy and bad input."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import Schedule

from core.errors import InvalidInput
from core.providers.tokens import count_message_tokens, count_tokens
from ingestion import tasks
from memories.conversations import node_memory
from memories.conversations.history import HistoryError, TokenBufferMemory, UnknownMessage
from memories.conversations.node_memory import (
    DuplicateMessage,
    MemoryConfig,
    MemoryConfigurationError,
    MemoryMode,
    NodeMemoryNotFound,
    NodeTokenBufferMemory,
    UnknownParent,
    memory_for,
    node_memory_append_turn,
    node_memory_clear,
    node_memory_delete_idle,
    node_memory_history,
)
from memories.conversations.node_memory import documents as node_documents
from memories.conversations.services import flow_create

pytestmark = pytest.mark.django_db
ERR = {"code", "message", "details"}
IMAGE = {
    "type": "image",
    "transfer_method": "local_file",
    "upload_file_id": "file-uuid-123",
    "belongs_to": "user",
}
CHART = {"type": "image", "transfer_method": "tool_file", "tool_file_id": "tool-9"}
LINK = {"type": "document", "transfer_method": "remote_url", "url": "https://example.com/a.pdf"}


@pytest.fixture(autouse=True)
def node_storage(settings, tmp_path):
    """A private local storage (overriding STORAGES resets Django's storage cache)."""
    root = tmp_path / "media"
    settings.STORAGES = {
        **settings.STORAGES,
        "node_memory_test": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(root)},
        },
    }
    settings.NODE_MEMORY_STORAGE = "node_memory_test"
    settings.NODE_MEMORY_GZIP_BYTES = 0
    return root


def _turn(flow, message_id, parent=node_memory.LATEST, user="q", assistant="a", node="llm1", **kw):
    return node_memory_append_turn(
        flow=flow,
        session_id=kw.pop("session_id", "s1"),
        node_id=node,
        message_id=message_id,
        parent_message_id=parent,
        user_content=user,
        assistant_content=assistant,
        **kw,
    )


def _doc_path(root, flow, session="s1", node="llm1"):
    return root / "node_memory" / str(flow.pk) / session / f"{node}.json"


def _contents(history):
    return [item.content for item in history.items]


@pytest.fixture
def seed_turns(flow):
    """The seed's example as turns: t3 regenerates the first answer, t4 follows it."""
    _turn(flow, "t1", None, "A", "A'")
    _turn(flow, "t2", "t1", "B", "B'")
    _turn(flow, "t3", None, "A", "A''")
    _turn(flow, "t4", "t3", "C", "C'")


def _base(flow, session="s1", node="llm1"):
    return f"/api/v1/conversations/{session}/nodes/{node}"


# --- turns and threads --------------------------------------------------------------
def test_seed_regeneration_example(flow, seed_turns):
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    assert _contents(history) == ["A", "A''", "C", "C'"]
    assert [(i.message_id, i.role) for i in history.items] == [
        ("t3", "user"),
        ("t3", "assistant"),
        ("t4", "user"),
        ("t4", "assistant"),
    ]
    older = node_memory_history(flow=flow, session_id="s1", node_id="llm1", current_message_id="t2")
    assert _contents(older) == ["A", "A'", "B", "B'"]
    _turn(flow, "t5", "t3", "C", "C''")  # regenerate C' as well
    latest = node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    assert _contents(latest) == ["A", "A''", "C", "C''"]


def test_document_format_on_storage(flow, node_storage):
    _turn(flow, "m1", None, "Analyze this image", "A landscape.", user_files=[IMAGE])
    doc = json.loads(_doc_path(node_storage, flow).read_bytes())
    assert set(doc) == {
        "version",
        "revision",
        "owner_id",
        "flow_id",
        "session_id",
        "node_id",
        "created_at",
        "updated_at",
        "messages",
    }
    assert (doc["version"], doc["revision"], doc["owner_id"]) == (1, 1, flow.owner_id)
    assert (doc["flow_id"], doc["session_id"], doc["node_id"]) == (str(flow.pk), "s1", "llm1")
    created = doc["messages"][0]["created_at"]
    assert doc["messages"] == [
        {
            "message_id": "m1",
            "parent_message_id": None,
            "role": "user",
            "content": "Analyze this image",
            "files": [IMAGE],
            "token_count": count_tokens("Analyze this image"),
            "created_at": created,
        },
        {
            "message_id": "m1",
            "parent_message_id": None,
            "role": "assistant",
            "content": "A landscape.",
            "files": [],
            "token_count": count_tokens("A landscape."),
            "created_at": created,
        },
    ]
    assert created.endswith("Z") and doc["updated_at"] == created


def test_omitted_parent_follows_the_newest_turn(flow):
    for i in range(3):
        _turn(flow, f"m{i}", user=f"q{i}", assistant=f"a{i}")
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    assert _contents(history) == ["q0", "a0", "q1", "a1", "q2", "a2"]
    assert [i.parent_message_id for i in history.items[::2]] == [None, "m0", "m1"]


def test_session_ids_that_are_not_plain_names_are_hashed(flow, node_storage):
    _turn(flow, "m1", session_id="user/../42")
    (conversation,) = (node_storage / "node_memory" / str(flow.pk)).iterdir()
    assert conversation.name.startswith("~") and len(conversation.name) == 65
    history = node_memory_history(flow=flow, session_id="user/../42", node_id="llm1")
    assert _contents(history) == ["q", "a"]


# --- token budget -------------------------------------------------------------------
def _cost(role, text):
    return count_message_tokens([{"role": role, "content": text}]) - 3


TURNS = [
    ("Which trains go from Porto to Lisbon?", "The Alfa Pendular, about three hours."),
    ("How much is a ticket?", "Between 25 and 45 euros in second class."),
    ("Can I take a bike?", "Yes, folded, or in the bike spaces of some trains."),
]


@pytest.mark.parametrize("keep", [2, 4, 6])
def test_truncation_keeps_the_newest_whole_turns_within_the_budget_exactly(flow, keep):
    for i, (question, answer) in enumerate(TURNS):
        _turn(flow, f"m{i}", user=question, assistant=answer)
    flat = [("user" if j % 2 == 0 else "assistant", t) for j, t in enumerate(sum(TURNS, ()))]
    newest = flat[-keep:]
    budget = 3 + sum(_cost(role, text) for role, text in newest)
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1", max_tokens=budget)
    assert [(i.role, i.content) for i in history.items] == newest
    assert history.token_count == budget == count_message_tokens(history.as_messages())
    assert [i.token_count for i in history.items] == [count_tokens(t) for _, t in newest]
    assert history.truncated == 6 - keep
    # One token less drops the oldest kept turn whole; the newest turn alone over the
    # budget gives an empty history.
    tighter = node_memory_history(flow=flow, session_id="s1", node_id="llm1", max_tokens=budget - 1)
    assert [(i.role, i.content) for i in tighter.items] == newest[2:]
    assert tighter.token_count == (
        budget - _cost(*newest[0]) - _cost(*newest[1]) if keep > 2 else 0
    )


# --- files, isolation ---------------------------------------------------------------
def test_files_round_trip_through_the_api(alice_client, flow):
    response = alice_client.post(
        f"{_base(flow)}/turns",
        {
            "flow": str(flow.pk),
            "message_id": "m1",
            "user_content": "Analyze this image",
            "user_files": [IMAGE, LINK],
            "assistant_content": "Here is a chart.",
            "assistant_files": [CHART],
        },
        format="json",
    )
    assert response.status_code == 201
    turn = response.json()
    assert (turn["message_id"], turn["parent_message_id"], turn["created"]) == ("m1", None, True)
    assert [m["files"] for m in turn["messages"]] == [[IMAGE, LINK], [CHART]]
    body = alice_client.get(f"{_base(flow)}/history", {"flow": str(flow.pk)}).json()
    assert [i["files"] for i in body["items"]] == [[IMAGE, LINK], [CHART]]
    assert body["messages"] == [
        {"role": "user", "content": "Analyze this image"},
        {"role": "assistant", "content": "Here is a chart."},
    ]


def test_a_turn_takes_difys_nil_parent_and_refuses_an_empty_side(alice_client, flow):
    """Dify's nil UUID as a parent was a 422 unknown_parent (a run's messages read it as
    "follows the newest"); a turn of empty texts and no files was stored and replayed."""
    nil = "00000000-0000-0000-0000-000000000000"

    def post(**body):
        return alice_client.post(f"{_base(flow)}/turns", {"flow": str(flow.pk), **body},
                                 format="json")  # fmt: skip

    assert post(message_id="m1", user_content="q1", assistant_content="a1").status_code == 201
    second = post(message_id="m2", parent_message_id=nil, user_content="q2",
                  assistant_content="a2")  # fmt: skip
    assert second.status_code == 201 and second.json()["parent_message_id"] == "m1"
    for body in ({"user_content": "", "assistant_content": "a"},
                 {"user_content": "q", "assistant_content": "  "}):  # fmt: skip
        refused = post(message_id="m3", **body)
        assert refused.status_code == 400, refused.content
        side = "user_content" if not body["user_content"] else "assistant_content"
        assert refused.json()["error"]["details"] == {side: ["Content has no text or file."]}
    only_a_file = post(message_id="m4", user_content="", user_files=[IMAGE], assistant_content="ok")
    assert only_a_file.status_code == 201
    history = alice_client.get(f"{_base(flow)}/history", {"flow": str(flow.pk)}).json()
    assert [i["message_id"] for i in history["items"]] == ["m1", "m1", "m2", "m2", "m4", "m4"]


def test_nodes_of_one_conversation_are_isolated(flow, node_storage):
    _turn(flow, "m1", user="for the planner", assistant="plan", node="planner")
    _turn(flow, "m1", user="for the writer", assistant="draft", node="writer")
    _turn(flow, "m2", user="again", assistant="plan 2", node="planner")
    planner = node_memory_history(flow=flow, session_id="s1", node_id="planner")
    writer = node_memory_history(flow=flow, session_id="s1", node_id="writer")
    assert _contents(planner) == ["for the planner", "plan", "again", "plan 2"]
    assert _contents(writer) == ["for the writer", "draft"]
    node_memory_clear(flow=flow, session_id="s1", node_id="planner")
    assert _contents(node_memory_history(flow=flow, session_id="s1", node_id="writer")) == [
        "for the writer",
        "draft",
    ]
    assert not _doc_path(node_storage, flow, node="planner").exists()


# --- concurrency --------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_lose_nothing(alice, node_storage):
    flow = flow_create(owner=alice, name="concurrent")
    workers, per_worker = 8, 5
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def work(w: int) -> None:
        try:
            barrier.wait()
            for i in range(per_worker):
                _turn(flow, f"w{w}-{i}", user=f"q{w}-{i}", assistant=f"a{w}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    doc = json.loads(_doc_path(node_storage, flow).read_bytes())
    ids = [m["message_id"] for m in doc["messages"][::2]]
    assert sorted(ids) == sorted(f"w{w}-{i}" for w in range(workers) for i in range(per_worker))
    assert doc["revision"] == workers * per_worker
    # Each omitted parent was resolved under the lock: one unbroken chain.
    assert [m["parent_message_id"] for m in doc["messages"][::2]] == [None, *ids[:-1]]
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1", max_tokens=100000)
    assert history.thread_length == 2 * workers * per_worker == len(history.items)


# --- clear --------------------------------------------------------------------------
def test_clear_through_the_api(alice_client, flow, seed_turns, node_storage):
    _turn(flow, "x1", node="other")
    response = alice_client.delete(_base(flow) + f"?flow={flow.pk}")
    assert response.status_code == 204
    assert not _doc_path(node_storage, flow).exists()
    again = alice_client.delete(_base(flow) + f"?flow={flow.pk}")
    assert again.status_code == 404 and set(again.json()["error"]) == ERR
    history = alice_client.get(f"{_base(flow)}/history", {"flow": str(flow.pk)})
    assert history.status_code == 404
    assert _doc_path(node_storage, flow, node="other").exists()


# --- idle cleanup -------------------------------------------------------------------
def _age(path, days):
    stamp = time.time() - days * 86400
    os.utime(path, (stamp, stamp))


def test_idle_cleanup_task(alice, flow, node_storage, settings):
    settings.NODE_MEMORY_IDLE_DAYS = 30
    other_flow = flow_create(owner=alice, name="other")
    _turn(flow, "m1", node="n1", session_id="idle")
    _turn(flow, "m1", node="n2", session_id="idle")
    _turn(flow, "m1", node="n1", session_id="busy")
    _turn(flow, "m1", node="n2", session_id="busy")
    _turn(other_flow, "m1", node="n1", session_id="old")
    for session, node, days in [
        ("idle", "n1", 31),
        ("idle", "n2", 40),
        ("busy", "n1", 45),
        ("busy", "n2", 1),
    ]:
        _age(_doc_path(node_storage, flow, session, node), days)
    _age(_doc_path(node_storage, other_flow, "old", "n1"), 31)

    assert tasks.node_memory_cleanup() == 3
    root = node_storage / "node_memory"
    assert not (root / str(flow.pk) / "idle").exists()  # empty directories go too
    assert not (root / str(other_flow.pk)).exists()
    # A conversation with one recent node keeps all its nodes.
    assert _doc_path(node_storage, flow, "busy", "n1").exists()
    assert _doc_path(node_storage, flow, "busy", "n2").exists()
    assert tasks.node_memory_cleanup() == 0  # safe to run twice
    with pytest.raises(NodeMemoryNotFound):
        node_memory_history(flow=flow, session_id="idle", node_id="n1")
    # The conversation still works afterwards: a new document starts.
    _turn(flow, "m9", node="n1", session_id="idle")
    assert _contents(node_memory_history(flow=flow, session_id="idle", node_id="n1")) == ["q", "a"]


def test_idle_cleanup_age_is_configurable_and_zero_disables(flow, node_storage, settings):
    _turn(flow, "m1")
    _age(_doc_path(node_storage, flow), 10)
    settings.NODE_MEMORY_IDLE_DAYS = 0
    assert node_memory_delete_idle() == 0
    assert node_memory_delete_idle(idle_days=11) == 0
    assert _doc_path(node_storage, flow).exists()
    assert node_memory_delete_idle(idle_days=9) == 1
    assert not _doc_path(node_storage, flow).exists()
    assert node_memory_delete_idle(idle_days=9, now=timezone.now() + timedelta(days=1)) == 0


def test_cleanup_is_scheduled_daily():
    schedule = Schedule.objects.get(name="node-memory-cleanup")
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "ingestion.tasks.node_memory_cleanup",
        Schedule.DAILY,
        -1,
    )


# --- gzip ---------------------------------------------------------------------------
def test_large_documents_are_gzipped_transparently(flow, node_storage, settings):
    settings.NODE_MEMORY_GZIP_BYTES = 1000
    plain = _doc_path(node_storage, flow)
    packed = plain.with_name("llm1.json.gz")
    _turn(flow, "m1", user="short", assistant="short")
    assert plain.exists() and not packed.exists()
    _turn(flow, "m2", user="long " * 200, assistant="long answer " * 100)
    assert packed.exists() and not plain.exists()
    doc = json.loads(gzip.decompress(packed.read_bytes()))
    assert [m["message_id"] for m in doc["messages"]] == ["m1", "m1", "m2", "m2"]
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1", max_tokens=100000)
    assert _contents(history)[:2] == ["short", "short"] and len(history.items) == 4
    settings.NODE_MEMORY_GZIP_BYTES = 0  # never compress: the next write goes back
    _turn(flow, "m3")
    assert plain.exists() and not packed.exists()
    assert len(node_memory_history(flow=flow, session_id="s1", node_id="llm1").items) == 6


def test_reads_prefer_the_newer_variant_after_a_crash(flow, node_storage):
    _turn(flow, "m1")
    plain = _doc_path(node_storage, flow)
    stale = json.loads(plain.read_bytes())
    _turn(flow, "m2")
    # As if a write of a gzipped variant crashed before deleting the older one.
    plain.with_name("llm1.json.gz").write_bytes(gzip.compress(json.dumps(stale).encode()))
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    assert [i.message_id for i in history.items] == ["m1", "m1", "m2", "m2"]


def test_parsed_documents_are_cached_but_never_stale(flow, node_storage):
    _turn(flow, "m1", user="first", assistant="reply")
    path = _doc_path(node_storage, flow)
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    assert _contents(history) == ["first", "reply"]
    assert node_documents._cache[f"node_memory/{flow.pk}/s1/llm1.json"][2]["revision"] == 1
    # Another process rewrites the document: the next read sees its content.
    doc = json.loads(path.read_bytes())
    doc["messages"][1]["content"] = "edited"
    path.write_text(json.dumps(doc))
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    assert _contents(history) == ["first", "edited"]
    _turn(flow, "m2", user="second", assistant="reply 2")
    history = node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    assert _contents(history) == ["first", "edited", "second", "reply 2"]
    # A rejected turn leaves neither the file nor the cached document changed.
    with pytest.raises(UnknownParent):
        _turn(flow, "m3", "ghost")
    assert len(node_memory_history(flow=flow, session_id="s1", node_id="llm1").items) == 4


# --- buffered memory object and configuration ---------------------------------------
def test_buffered_memory_flushes_all_or_nothing(flow, node_storage):
    memory = NodeTokenBufferMemory(flow=flow, conversation_id="s1", node_id="llm1")
    assert memory.get_history().items == []
    memory.add_messages(
        message_id="m1", parent_message_id=None, user_content="A", assistant_content="A'"
    )
    memory.add_messages(
        message_id="m2", parent_message_id="m1", user_content="B", assistant_content="B'"
    )
    assert memory.get_history_prompt_messages() == [
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "A'"},
        {"role": "user", "content": "B"},
        {"role": "assistant", "content": "B'"},
    ]
    assert not _doc_path(node_storage, flow).exists()  # buffered only
    assert [t.message_id for t in memory.flush()] == ["m1", "m2"]
    assert memory.pending == 0 and memory.flush() == []
    assert _contents(node_memory_history(flow=flow, session_id="s1", node_id="llm1")) == [
        "A",
        "A'",
        "B",
        "B'",
    ]

    before = _doc_path(node_storage, flow).read_bytes()
    memory.add_messages(message_id="m3", user_content="C", assistant_content="C'")
    assert _contents(memory.get_history())[-2:] == ["C", "C'"]
    stored = node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    assert _contents(stored) == ["A", "A'", "B", "B'"]  # pending turns stay in-process
    memory.add_messages(
        message_id="m4", parent_message_id="nope", user_content="D", assistant_content="D'"
    )
    with pytest.raises(UnknownParent):
        memory.flush()
    assert _doc_path(node_storage, flow).read_bytes() == before  # m3 not written either
    memory.clear()
    assert memory.pending == 0 and not _doc_path(node_storage, flow).exists()
    memory.clear()  # nothing to clear: no error in-process


def test_memory_for_node_mode_needs_a_conversation(flow):
    with pytest.raises(MemoryConfigurationError) as info:
        memory_for(MemoryConfig(mode="node"), flow=flow, conversation_id=None, node_id="llm1")
    assert str(info.value).startswith("node memory needs a conversation id")
    with pytest.raises(MemoryConfigurationError, match="node memory needs a node id"):
        memory_for(MemoryConfig(mode=MemoryMode.NODE), flow=flow, conversation_id="s1")
    with pytest.raises(MemoryConfigurationError, match="conversation memory needs a conversation"):
        memory_for(MemoryConfig(), flow=flow, conversation_id="")
    with pytest.raises(MemoryConfigurationError, match="'conversation' or 'node', not 'graph'"):
        MemoryConfig(mode="graph")
    node = memory_for(MemoryConfig(mode="node"), flow=flow, conversation_id="s1", node_id="llm1")
    assert isinstance(node, NodeTokenBufferMemory) and node.key.node_id == "llm1"
    conversation = memory_for(MemoryConfig(), flow=flow, conversation_id="s1", node_id="llm1")
    assert isinstance(conversation, TokenBufferMemory)
    assert conversation.conversation_id == "s1"


# --- bad input ----------------------------------------------------------------------
def test_service_bad_input_writes_nothing(flow, seed_turns, node_storage):
    path = _doc_path(node_storage, flow)
    before = path.read_bytes()
    with pytest.raises(DuplicateMessage):
        _turn(flow, "t2", "t1", "B", "different")
    with pytest.raises(UnknownParent, match="cannot be its own parent"):
        _turn(flow, "t9", "t9")
    with pytest.raises(UnknownParent, match="'ghost' is not in this node memory"):
        _turn(flow, "t9", "ghost")
    with pytest.raises(InvalidInput, match="node_id: must be"):
        _turn(flow, "t9", node="../etc")
    with pytest.raises(HistoryError, match="message_id must be"):
        _turn(flow, "  ")
    assert path.read_bytes() == before
    # An identical replay (a retried request) changes nothing and is not an error.
    replay = _turn(flow, "t2", "t1", "B", "B'")
    assert (replay.created, replay.message_id, replay.parent_message_id) == (False, "t2", "t1")
    assert path.read_bytes() == before
    with pytest.raises(UnknownMessage):
        node_memory_history(flow=flow, session_id="s1", node_id="llm1", current_message_id="zz")
    with pytest.raises(HistoryError, match="max_tokens must be at least 1"):
        node_memory_history(flow=flow, session_id="s1", node_id="llm1", max_tokens=0)
    with pytest.raises(NodeMemoryNotFound):
        node_memory_history(flow=flow, session_id="s1", node_id="unknown")
    with pytest.raises(NodeMemoryNotFound):
        node_memory_clear(flow=flow, session_id="nobody", node_id="llm1")


@pytest.mark.parametrize(
    "change, status, code",
    [
        ({"message_id": "t2", "assistant_content": "other"}, 409, "duplicate_message"),
        ({"parent_message_id": "ghost"}, 422, "unknown_parent"),
        ({"message_id": "t9", "parent_message_id": "t9"}, 422, "unknown_parent"),
        ({"message_id": ""}, 400, "invalid"),
        ({"flow": "not-a-uuid"}, 400, "invalid"),
        ({"user_files": [{"type": "image", "transfer_method": "local_file"}]}, 400, "invalid"),
        ({"user_content": None}, 400, "invalid"),
    ],
)
def test_api_bad_turns_write_nothing(
    alice_client, flow, seed_turns, node_storage, change, status, code
):
    before = _doc_path(node_storage, flow).read_bytes()
    body = {
        "flow": str(flow.pk),
        "message_id": "t9",
        "parent_message_id": "t1",
        "user_content": "q",
        "assistant_content": "a",
        **change,
    }
    response = alice_client.post(f"{_base(flow)}/turns", body, format="json")
    assert response.status_code == status
    assert set(response.json()["error"]) == ERR and response.json()["error"]["code"] == code
    assert _doc_path(node_storage, flow).read_bytes() == before


def test_api_invalid_node_id_is_400(alice_client, flow):
    body = {"flow": str(flow.pk), "message_id": "m", "user_content": "q", "assistant_content": "a"}
    response = alice_client.post(f"{_base(flow, node='bad%20node')}/turns", body, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid"


def test_api_replay_answers_200(alice_client, flow):
    body = {"flow": str(flow.pk), "message_id": "m1", "user_content": "q", "assistant_content": "a"}
    assert alice_client.post(f"{_base(flow)}/turns", body, format="json").status_code == 201
    again = alice_client.post(f"{_base(flow)}/turns", body, format="json")
    assert again.status_code == 200 and again.json()["created"] is False


@pytest.mark.parametrize(
    "params, status, code",
    [
        ({"current_message_id": "ghost"}, 422, "unknown_message"),
        ({"max_tokens": 0}, 400, "invalid"),
        ({"flow": None}, 400, "invalid"),
    ],
)
def test_api_history_bad_input(alice_client, flow, seed_turns, params, status, code):
    query = {k: v for k, v in {"flow": str(flow.pk), **params}.items() if v is not None}
    response = alice_client.get(f"{_base(flow)}/history", query)
    assert response.status_code == status
    assert set(response.json()["error"]) == ERR and response.json()["error"]["code"] == code


def test_api_history_formats_and_current(alice_client, flow, seed_turns):
    query = {"flow": str(flow.pk), "current_message_id": "t2", "format": "text", "ai_prefix": "AI"}
    body = alice_client.get(f"{_base(flow)}/history", query).json()
    assert body["text"] == "Human: A\nAI: A'\nHuman: B\nAI: B'"
    assert [i["message_id"] for i in body["items"]] == ["t1", "t1", "t2", "t2"]
    assert body["items"][2]["parent_message_id"] == "t1"
    assert body["token_count"] == count_message_tokens(
        [{"role": i["role"], "content": i["content"]} for i in body["items"]]
    )


def test_api_unknown_conversation_or_node_is_404(alice_client, flow, seed_turns):
    for url in (_base(flow, session="nobody"), _base(flow, node="nobody")):
        response = alice_client.get(f"{url}/history", {"flow": str(flow.pk)})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_tenant_isolation(
    alice_client, bob_client, anon_client, bob, flow, seed_turns, node_storage
):
    path = _doc_path(node_storage, flow)
    before = path.read_bytes()
    turn = {"flow": str(flow.pk), "message_id": "b1", "user_content": "q", "assistant_content": "a"}
    # Bob with Alice's flow id: 404 for every call, and nothing changes.
    assert bob_client.post(f"{_base(flow)}/turns", turn, format="json").status_code == 404
    assert bob_client.get(f"{_base(flow)}/history", {"flow": str(flow.pk)}).status_code == 404
    assert bob_client.delete(f"{_base(flow)}?flow={flow.pk}").status_code == 404
    assert anon_client.get(f"{_base(flow)}/history", {"flow": str(flow.pk)}).status_code == 401
    assert anon_client.delete(f"{_base(flow)}?flow={flow.pk}").status_code == 401
    assert path.read_bytes() == before
    # Bob's own flow and the same session and node ids: a separate document.
    bobs_flow = flow_create(owner=bob, name="bobs")
    turn["flow"] = str(bobs_flow.pk)
    assert bob_client.post(f"{_base(flow)}/turns", turn, format="json").status_code == 201
    bobs = bob_client.get(f"{_base(flow)}/history", {"flow": str(bobs_flow.pk)}).json()
    assert bobs["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    mine = alice_client.get(f"{_base(flow)}/history", {"flow": str(flow.pk)}).json()
    assert [m["content"] for m in mine["messages"]] == ["A", "A''", "C", "C'"]
    assert path.read_bytes() == before


def test_a_document_of_another_owner_is_not_found(flow, bob, node_storage):
    _turn(flow, "m1")
    path = _doc_path(node_storage, flow)
    doc = json.loads(path.read_bytes())
    doc["owner_id"] = bob.pk  # e.g. a document copied over by hand
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    with pytest.raises(NodeMemoryNotFound):
        node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    with pytest.raises(NodeMemoryNotFound):
        _turn(flow, "m2")
    assert path.read_bytes() == before


@pytest.mark.parametrize("written", ["team/nodes/x", "team%2Fnodes%2Fx"])
def test_a_session_id_holding_nodes_has_its_history_read(alice_client, flow, written):
    """``/runs`` takes the session id ``team/nodes/x``, whose history's path is node
    ``x``'s of conversation ``team``: it answered 404 "no memory for node 'x'", raw or
    encoded. Without that node's memory, the path reads the session's history; with it,
    the node's (the route's first meaning)."""
    said = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]
    posted = alice_client.post(f"/api/v1/flows/{flow.pk}/runs",
                               {"session_id": "team/nodes/x", "messages": said}, format="json")  # fmt: skip
    assert posted.status_code == 201
    url = f"/api/v1/conversations/{written}/history"
    read = alice_client.get(url, {"flow": str(flow.pk)})
    assert read.status_code == 200, read.json()
    assert read.json()["messages"] == said
    summarized = alice_client.get(url, {"flow": str(flow.pk), "strategy": "summarize"})
    assert summarized.status_code == 200 and summarized.json()["messages"] == said
    node_memory_append_turn(flow=flow, session_id="team", node_id="x", message_id="m1",
                            user_content="node question", assistant_content="node answer")  # fmt: skip
    node = alice_client.get(url, {"flow": str(flow.pk)}).json()
    assert [m["content"] for m in node["messages"]] == ["node question", "node answer"]
    missing = alice_client.get("/api/v1/conversations/team/nodes/y/history", {"flow": str(flow.pk)})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == (
        "no memory for node 'y' in conversation 'team' of this flow"
    )


def test_deleting_a_sessions_messages_deletes_its_summary_and_node_memory(
    alice, alice_client, django_capture_on_commit_callbacks
):
    """DELETE .../sessions/{id}/messages left the session's running summary (served as
    the history of the emptied conversation, and extended by its next messages) and its
    node memory (served as before)."""
    from memories.conversations.models import ConversationSummary

    flow = flow_create(owner=alice, name="desk")
    for session in ("s1", "s2"):
        alice_client.post(f"/api/v1/flows/{flow.pk}/runs", {"session_id": session, "messages": [
            {"role": "user", "content": "My printer is offline."}]}, format="json")  # fmt: skip
        _turn(flow, "t1", session_id=session, user="My SSN is 123-45-6789")
        ConversationSummary.objects.create(owner=alice, key=f"flow:{flow.pk}:{session}",
                                           text="A printer was offline.", token_count=5)  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        gone = alice_client.delete(f"/api/v1/flows/{flow.pk}/sessions/s1/messages")
    assert gone.status_code == 200 and gone.json() == {"deleted": 1}
    history = alice_client.get(f"/api/v1/conversations/s1/history?flow={flow.pk}"
                               "&strategy=summarize&max_tokens=1000")  # fmt: skip
    assert history.status_code == 200 and history.json()["messages"] == []
    assert set(ConversationSummary.objects.values_list("key", flat=True)) == {f"flow:{flow.pk}:s2"}
    with pytest.raises(NodeMemoryNotFound):
        node_memory_history(flow=flow, session_id="s1", node_id="llm1")
    kept = node_memory_history(flow=flow, session_id="s2", node_id="llm1")  # the other stays
    assert _contents(kept) == ["My SSN is 123-45-6789", "a"]
