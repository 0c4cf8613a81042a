"""Memory formation: extraction, dedup, contradiction, refinement, flip-flop, audit."""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from memories.personal.formation import memory_formation_run, parse_json_object
from memories.personal.models import EndUser, MemoryUpdate, MetricCounter, UserVector, Vector
from memories.personal.services import end_user_ensure, memory_add, memory_link
from tests.fakes.openai_server import Scripted, chat_body
from tests.memories.personal.conftest import scripted_llm

pytestmark = pytest.mark.django_db


@pytest.fixture
def llm(llm_settings, openai_server, fixture_embedder):
    return openai_server


def _user(owner, name="u1"):
    return end_user_ensure(owner=owner, external_id=name)


def _seed(end_user, *facts, minutes_ago=60):
    at = timezone.now() - timedelta(minutes=minutes_ago)
    return [memory_add(end_user=end_user, content=f, observed_at=at)[0] for f in facts]


def _active(end_user):
    return sorted(Vector.objects.filter(links__end_user=end_user).values_list("content", flat=True))


def _counter(name):
    return MetricCounter.objects.filter(name=name).values_list("value", flat=True).first() or 0


def test_contradiction_replaces_for_this_user_only_with_audit(alice, llm):
    u1, u2 = _user(alice, "u1"), _user(alice, "u2")
    (bun,) = _seed(u1, "User uses Bun")
    memory_link(end_user=u2, vector=bun)  # a shared memory
    llm.chat_fn = scripted_llm(
        {"I switched from Bun to Node.js last week": ["User uses Node.js"]},
        {
            "User uses Node.js": {
                "action": "replace",
                "target": "User uses Bun",
                "reason": "User switched from Bun to Node",
            }
        },
    )
    decisions = memory_formation_run(
        owner_id=alice.pk,
        external_id="u1",
        message="I switched from Bun to Node.js last week",
        message_at=timezone.now(),
    )
    assert [(d.fact, d.action, d.reason, d.target_id) for d in decisions] == [
        ("User uses Node.js", "replace", "User switched from Bun to Node", str(bun.pk))
    ]
    assert _active(u1) == ["User uses Node.js"]
    assert _active(u2) == ["User uses Bun"]  # the other user keeps the shared memory
    assert Vector.objects.filter(pk=bun.pk).exists()
    audit = MemoryUpdate.objects.get(end_user=u1, action="replace")
    assert (audit.old_vector_id, audit.old_content, audit.new_content, audit.reason) == (
        bun.pk,
        "User uses Bun",
        "User uses Node.js",
        "User switched from Bun to Node",
    )
    assert audit.new_vector.content == "User uses Node.js"
    assert _counter("memory_replacements_total") == 1


def test_refinement_replaces(alice, llm):
    u1 = _user(alice)
    (js,) = _seed(u1, "User likes JavaScript")
    llm.chat_fn = scripted_llm(
        {"Actually I really like TypeScript": ["User likes TypeScript"]},
        {
            "User likes TypeScript": {
                "action": "replace",
                "target": "User likes JavaScript",
                "reason": "more specific",
            }
        },
    )
    (decision,) = memory_formation_run(
        owner_id=alice.pk,
        external_id="u1",
        message="Actually I really like TypeScript",
        message_at=timezone.now(),
    )
    assert (decision.action, decision.target_id) == ("replace", str(js.pk))
    assert _active(u1) == ["User likes TypeScript"]
    assert not Vector.objects.filter(pk=js.pk).exists()  # nobody else linked it
    assert MemoryUpdate.objects.get(action="replace").old_content == "User likes JavaScript"


def test_redundancy_exact_and_semantic_are_ignored(alice, llm):
    u1 = _user(alice)
    (dog,) = _seed(u1, "User has a dog named Rex")
    llm.chat_fn = scripted_llm(
        {"My dog is called Rex": ["user has a dog named Rex.", "User owns a dog called Rex"]}
    )
    decisions = memory_formation_run(
        owner_id=alice.pk,
        external_id="u1",
        message="My dog is called Rex",
        message_at=timezone.now(),
    )
    assert [(d.action, d.reason, d.target_id) for d in decisions] == [
        ("ignore", "exact duplicate", str(dog.pk)),
        ("ignore", "semantic duplicate", str(dog.pk)),  # cosine 0.904 >= 0.9
    ]
    assert _active(u1) == ["User has a dog named Rex"]
    assert MemoryUpdate.objects.count() == 1  # only the seed's add
    assert _counter("memory_dedup_total") == 2
    # No conflict prompt was needed for duplicates: one LLM call (the extraction).
    assert len(llm.requests) == 1


def test_new_information_is_added_with_audit(alice, llm):
    u1 = _user(alice)
    _seed(u1, "User works as a nurse")
    message = "I drink green tea every morning and I play the violin"
    llm.chat_fn = scripted_llm(
        {message: ["User drinks green tea every morning", "User plays the violin"]}
    )
    decisions = memory_formation_run(
        owner_id=alice.pk, external_id="u1", message=message, message_at=timezone.now()
    )
    assert [(d.fact, d.action) for d in decisions] == [
        ("User drinks green tea every morning", "add"),
        ("User plays the violin", "add"),
    ]
    assert _active(u1) == [
        "User drinks green tea every morning",
        "User plays the violin",
        "User works as a nurse",
    ]
    adds = MemoryUpdate.objects.filter(end_user=u1, action="add").order_by("created_at")
    assert [a.new_content for a in adds][1:] == [
        "User drinks green tea every morning",
        "User plays the violin",
    ]


def test_flip_flop_guard_refuses_replacing_a_newer_memory(alice, llm):
    u1 = _user(alice)
    future = timezone.now() + timedelta(minutes=5)
    bun, _ = memory_add(end_user=u1, content="User uses Bun", observed_at=future)
    llm.chat_fn = scripted_llm(
        {"I switched from Bun to Node.js last week": ["User uses Node.js"]},
        {
            "User uses Node.js": {
                "action": "replace",
                "target": "User uses Bun",
                "reason": "switched",
            }
        },
    )
    (decision,) = memory_formation_run(
        owner_id=alice.pk,
        external_id="u1",
        message="I switched from Bun to Node.js last week",
        message_at=timezone.now(),
    )
    assert (decision.action, decision.target_id) == ("ignore", str(bun.pk))
    assert "flip-flop" in decision.reason
    assert _active(u1) == ["User uses Bun"]
    assert not MemoryUpdate.objects.filter(action="replace").exists()


def test_same_time_is_not_strictly_newer(alice, llm):
    u1 = _user(alice)
    at = timezone.now()
    memory_add(end_user=u1, content="User uses Bun", observed_at=at)
    llm.chat_fn = scripted_llm(
        {"I switched from Bun to Node.js last week": ["User uses Node.js"]},
        {
            "User uses Node.js": {
                "action": "replace",
                "target": "User uses Bun",
                "reason": "switched",
            }
        },
    )
    (decision,) = memory_formation_run(
        owner_id=alice.pk,
        external_id="u1",
        message="I switched from Bun to Node.js last week",
        message_at=at,
    )
    assert decision.action == "ignore"


@pytest.mark.django_db(transaction=True)
def test_parallel_runs_extracting_the_same_fact_leave_one_memory(alice, llm):
    message = "I drink green tea every morning and I play the violin"
    llm.chat_fn = scripted_llm({message: ["User drinks green tea every morning"]})
    barrier = threading.Barrier(3)
    results = []

    def run():
        try:
            barrier.wait()
            results.append(
                memory_formation_run(
                    owner_id=alice.pk, external_id="u1", message=message, message_at=timezone.now()
                )
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    actions = sorted(r[0].action for r in results)
    assert actions == ["add", "ignore", "ignore"]
    end_user = EndUser.objects.get(external_id="u1")
    assert _active(end_user) == ["User drinks green tea every morning"]
    assert Vector.objects.count() == 1
    assert MemoryUpdate.objects.filter(action="add").count() == 1


def test_malformed_json_is_repaired(alice, llm):
    message = "My dog is called Rex"
    llm.push(
        Scripted(
            body=chat_body(
                'Sure! Here you go:\n```json\n{"memories": ["User has a dog named Rex",]}\n```'
            )
        )
    )
    (decision,) = memory_formation_run(
        owner_id=alice.pk, external_id="u1", message=message, message_at=timezone.now()
    )
    assert decision.action == "add"
    assert len(llm.requests) == 1


def test_malformed_json_is_retried_then_given_up_without_crashing(alice, llm, caplog):
    llm.push(
        Scripted(body=chat_body("I cannot do that")), Scripted(body=chat_body("still not json"))
    )
    with caplog.at_level(logging.INFO, logger="memories.decisions"):
        decisions = memory_formation_run(
            owner_id=alice.pk,
            external_id="u1",
            message="My dog is called Rex",
            message_at=timezone.now(),
        )
    assert decisions == []
    assert len(llm.requests) == 2
    assert llm.requests[1]["json"]["messages"][-1]["content"].startswith(
        "Your previous answer was not valid JSON"
    )
    malformed = [
        json.loads(r.message) for r in caplog.records if "memory_llm_malformed_json" in r.message
    ]
    assert [m["attempt"] for m in malformed] == [1, 2]
    assert _counter("memory_llm_malformed_total") == 1
    assert not Vector.objects.exists()


def test_retry_fixes_malformed_json(alice, llm):
    llm.push(
        Scripted(body=chat_body("not json")),
        Scripted(body=chat_body('{"memories": ["User has a dog named Rex"]}')),
    )
    (decision,) = memory_formation_run(
        owner_id=alice.pk,
        external_id="u1",
        message="My dog is called Rex",
        message_at=timezone.now(),
    )
    assert decision.action == "add"


def test_one_memory_decision_log_line_per_run(alice, llm, caplog):
    u1 = _user(alice)
    _seed(u1, "User has a dog named Rex")
    message = "I drink green tea every morning and I play the violin"
    llm.chat_fn = scripted_llm(
        {message: ["User drinks green tea every morning", "User has a dog named Rex"]}
    )
    with caplog.at_level(logging.INFO, logger="memories.decisions"):
        memory_formation_run(
            owner_id=alice.pk, external_id="u1", message=message, message_at=timezone.now()
        )
    lines = [json.loads(r.message) for r in caplog.records if '"memory_decision"' in r.message]
    assert len(lines) == 1
    line = lines[0]
    assert (line["user_id"], line["input_message_length"], line["extracted_count"]) == (
        "u1",
        len(message),
        2,
    )
    assert [(d["fact"], d["action"]) for d in line["decisions"]] == [
        ("User drinks green tea every morning", "add"),
        ("User has a dog named Rex", "ignore"),
    ]
    assert line["decisions"][1]["reason"] == "exact duplicate"
    assert (line["llm_calls"], line["llm_tokens"]) == (1, 220)


def test_rerun_of_the_same_message_writes_nothing(alice, llm):
    message = "I drink green tea every morning and I play the violin"
    llm.chat_fn = scripted_llm(
        {message: ["User drinks green tea every morning", "User plays the violin"]}
    )
    memory_formation_run(
        owner_id=alice.pk, external_id="u1", message=message, message_at=timezone.now()
    )
    before = (Vector.objects.count(), MemoryUpdate.objects.count(), UserVector.objects.count())
    again = memory_formation_run(
        owner_id=alice.pk, external_id="u1", message=message, message_at=timezone.now()
    )
    assert [d.action for d in again] == ["ignore", "ignore"]
    assert (
        Vector.objects.count(),
        MemoryUpdate.objects.count(),
        UserVector.objects.count(),
    ) == before


def test_upstream_failure_ends_the_run_quietly(alice, llm):
    llm.push(*[Scripted(status=500, body={"error": {"message": "down"}})] * 4)
    assert (
        memory_formation_run(
            owner_id=alice.pk,
            external_id="u1",
            message="My dog is called Rex",
            message_at=timezone.now(),
        )
        == []
    )
    assert not Vector.objects.exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"memories": ["a"]}', {"memories": ["a"]}),
        ('```json\n{"memories": ["a"]}\n```', {"memories": ["a"]}),
        ('Here: {"memories": ["a", "b",],}', {"memories": ["a", "b"]}),
        ('["a", "b"]', {"memories": ["a", "b"]}),
        ("no json here", None),
        ("", None),
    ],
)
def test_parse_json_object(text, expected):
    assert parse_json_object(text) == expected
