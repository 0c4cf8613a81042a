"""The engine end to end over REST with a scripted LLM (issue 12's "done when"): a
conversation flushed in bursts costs one extraction per debounce window; its facts land
with categories and confidences; the journal reads back; a dream rewrites MEMORY.md and
the diary, and undo restores the facts and MEMORY.md; a running summary keeps the newest
human message and grows incrementally; another owner's key gets 404."""

from __future__ import annotations

import re
import time

import pytest
from django.utils import timezone
from django_q.models import Schedule
from django_q.scheduler import scheduler

from memories.engine import files
from memories.engine.models import PendingUpdate
from memories.facts.models import Fact
from tests.memories.engine.scripted import EngineLLM, fact

pytestmark = pytest.mark.django_db
SCOPE = ["user", "alice"]
Q = {"scope": SCOPE}
TEA, RUST, DARK = (
    "I drink green tea every morning", "I am learning Rust this year", "Please use dark mode, always",
)  # fmt: skip
COFFEE, BERLIN = "Actually I switched to coffee", "I moved to Berlin last week"


class Conversation(EngineLLM):
    """Extractions by message; "switched to coffee" corrects the tea fact, naming its id
    from the prompt's list of current facts."""

    def _extract(self, content: str) -> dict:
        answer = super()._extract(content)
        if f"user: {COFFEE}" in content:
            tea = re.search(r"^(\S+) \| \w+ \| [0-9.]+ \| User drinks green tea", content, re.M)
            answer["newFacts"].append(fact("User drinks coffee, not tea", "correction", 0.95,
                                           replaces=tea.group(1) if tea else None))  # fmt: skip
        return answer


def _dream(prompt: str) -> dict:
    ids = dict(re.findall(r"^- \[[0-9.]+\] (.*) \(id: ([0-9a-f-]+)\)$", prompt, re.M))
    return {
        "facts": [
            {"id": ids["User is learning Rust"], "content": "User is learning Rust in 2026",
             "category": "goal", "confidence": 0.9},  # refined
            {"id": ids["User prefers dark mode"], "content": "User prefers dark mode"},
            {"id": ids["User drinks coffee, not tea"], "content": "User drinks coffee, not tea"},
            {"id": ids["User lives in Berlin"], "content": "User lives in Berlin"},
            # "User may like Go" (a guess) is dropped as redundant
            {"id": None, "content": "User moved house recently", "category": "context",
             "confidence": 0.8, "day": timezone.now().date().isoformat()},
        ],
        "diary": "Refined the Rust goal, dropped a guess, noted the move.",
    }  # fmt: skip


@pytest.fixture
def script(llm_settings, openai_server, engine_storage, settings):
    # Only the scope's one-off schedules here: the platform's periodic ones (the daily
    # dream among them) are due in a fresh database and are not what this test is about.
    Schedule.objects.all().delete()
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 1  # a short window, really waited for
    settings.ENGINE_MIN_CONFIDENCE = 0.5
    conversation = Conversation(
        {
            TEA: [fact("User drinks green tea every morning", "behavior", 0.95)],
            RUST: [fact("User is learning Rust", "goal", 0.9),
                   fact("User may like Go", "preference", 0.55)],
            DARK: [fact("User prefers dark mode", "preference", 0.98)],
            BERLIN: [fact("User lives in Berlin", "context", 0.9)],
        },
        dream=_dream,
    )  # fmt: skip
    openai_server.chat_fn = conversation
    return conversation


def _burst(client, texts: list[str]) -> None:
    for text in texts:
        reply = client.post("/api/v1/engine/flush", {
            "scope": SCOPE, "messages": [{"role": "user", "content": text}]}, format="json")  # fmt: skip
        assert reply.status_code == 202 and reply.json()["status"] == "pending"


def _window_closes() -> None:
    """Wait out the window, then let django-q2's scheduler fire the scope's one-off
    schedule (what the cluster does about every 30 s); the task runs inline (sync)."""
    time.sleep(1.2)
    assert Schedule.objects.filter(name__startswith="engine-updates:").count() == 1
    scheduler()
    assert not Schedule.objects.filter(name__startswith="engine-updates:").exists()  # fired


def _facts(client) -> list[tuple[str, str, float, str]]:
    rows = client.get("/api/v1/engine/facts", Q).json()["results"]
    return sorted((f["content"], f["category"], f["confidence"], f["source"]["kind"]) for f in rows)


def test_a_conversation_through_every_tier(alice, alice_client, bob_client, script):
    # --- debounced updates: one extraction per window --------------------------------
    _burst(alice_client, [TEA, RUST, DARK])
    assert script.calls["extraction"] == 0  # the window is open
    _window_closes()
    assert script.calls["extraction"] == 1
    _burst(alice_client, [COFFEE, BERLIN])
    _window_closes()
    assert script.calls["extraction"] == 2  # five flushes, two windows, two calls
    assert alice_client.get("/api/v1/engine/updates", Q).json()["count"] == 5
    assert set(PendingUpdate.objects.values_list("status", flat=True)) == {"done"}
    assert len(set(PendingUpdate.objects.values_list("batch_id", flat=True))) == 2

    # --- core facts, with categories, confidences and their source -------------------
    learned = [
        ("User drinks coffee, not tea", "correction", 0.95, "message"),
        ("User is learning Rust", "goal", 0.9, "message"),
        ("User lives in Berlin", "context", 0.9, "message"),
        ("User may like Go", "preference", 0.55, "message"),
        ("User prefers dark mode", "preference", 0.98, "message"),
    ]
    assert _facts(alice_client) == learned  # the tea fact was replaced by its correction

    # --- the journal ---------------------------------------------------------------
    today = timezone.now().date().isoformat()
    journal = alice_client.get("/api/v1/engine/journal", {**Q, "date": today}).json()["markdown"]
    assert journal.startswith(f"# Journal · user/alice · {today}\n\n")
    assert re.findall(r"^- \*\*user\*\*: (.*)$", journal, re.M) == [TEA, RUST, DARK, COFFEE, BERLIN]
    assert len(re.findall(r"^## \d\d:\d\d:\d\d UTC · api$", journal, re.M)) == 5

    # --- a dream rewrites MEMORY.md and the diary; undo puts everything back -----------
    memory_md = files.memory_md_path(alice.pk, SCOPE)
    before_md = files.read_text(memory_md)  # the last update run wrote it
    dreamed = alice_client.post("/api/v1/engine/dream", {**Q, "lookback_days": 1}, format="json")
    assert dreamed.status_code == 201 and script.calls["dream"] == 1
    dream = dreamed.json()
    assert dream["memory_md_before"] == before_md
    assert files.read_text(memory_md) == dream["memory_md_after"] != before_md
    assert "- [0.90] User is learning Rust in 2026 (id: " in dream["memory_md_after"]
    assert "User may like Go" not in dream["memory_md_after"]
    diary = files.read_text(files.diary_path(alice.pk, SCOPE, timezone.now().date()))
    assert f"## Dream {dream['id']} " in diary
    assert "Refined the Rust goal, dropped a guess, noted the move." in diary
    assert _facts(alice_client) == [
        ("User drinks coffee, not tea", "correction", 0.95, "message"),
        ("User is learning Rust in 2026", "goal", 0.9, "dream"),
        ("User lives in Berlin", "context", 0.9, "message"),
        ("User moved house recently", "context", 0.8, "journal"),
        ("User prefers dark mode", "preference", 0.98, "message"),
    ]
    undone = alice_client.post(f"/api/v1/engine/dreams/{dream['id']}/undo")
    assert undone.status_code == 200 and undone.json()["status"] == "undone"
    assert _facts(alice_client) == learned
    assert files.read_text(memory_md) == before_md
    diary = files.read_text(files.diary_path(alice.pk, SCOPE, timezone.now().date()))
    assert f"## Undo of dream {dream['id']} " in diary

    # --- context summaries: the newest human message stays, the summary grows ----------
    said = [("user", "Where should we eat tonight? " + "options " * 20),
            ("assistant", "Try the Thai place. " + "details " * 20),
            ("user", "Is it open on Sundays? " + "asking " * 20),
            ("assistant", "Yes, until ten. " + "hours " * 20),
            ("user", "Book a table for two at eight, near the window please.")]  # fmt: skip
    messages = [{"id": f"m{i}", "role": r, "content": c} for i, (r, c) in enumerate(said)]
    body = {**Q, "conversation_id": "dinner", "max_tokens": 90, "max_summary_tokens": 30}
    first = alice_client.post("/api/v1/engine/summaries", {**body, "messages": messages},
                              format="json").json()  # fmt: skip
    assert first["llm_calls"] == 1 and first["folded_now"] == ["m0", "m1", "m2"]
    assert first["messages"][-1] == {"role": "user", "content": said[-1][1]}  # kept verbatim
    assert first["token_count"] <= 90
    later = [*messages,
             {"id": "m5", "role": "assistant", "content": "Booked for eight. " + "note " * 20},
             {"id": "m6", "role": "user", "content": "Thanks! Also remind me to bring cash."}]  # fmt: skip
    second = alice_client.post("/api/v1/engine/summaries", {**body, "messages": later},
                               format="json").json()  # fmt: skip
    assert second["folded_now"] == ["m3", "m4"]  # only what is new
    assert second["running_summary"]["summarized_message_ids"] == [f"m{i}" for i in range(5)]
    assert second["running_summary"]["last_summarized_message_id"] == "m4"
    assert second["messages"][-1]["content"] == "Thanks! Also remind me to bring cash."
    extend = script.prompts["summary"][1]
    assert extend.startswith("This is the summary of the conversation so far:\n"
                             + first["running_summary"]["text"])  # fmt: skip
    assert "Where should we eat" not in extend  # the folded messages are not sent again
    assert script.calls == {"extraction": 2, "dream": 1, "summary": 2, "chat": 0}

    # --- another owner: 404 on every read of alice's scope and dream, nothing changed --
    facts_before = sorted(Fact.objects.values_list("id", "content", "confidence"))
    for reply in (
        bob_client.get("/api/v1/engine/facts", Q),
        bob_client.get("/api/v1/engine/journal", {**Q, "date": today}),
        bob_client.get("/api/v1/engine/updates", Q),
        bob_client.get("/api/v1/engine/dreams", Q),
        bob_client.get(f"/api/v1/engine/dreams/{dream['id']}"),
        bob_client.post(f"/api/v1/engine/dreams/{dream['id']}/undo"),
        bob_client.post("/api/v1/engine/search", {**Q, "query": "coffee"}, format="json"),
        bob_client.post("/api/v1/engine/dream", Q, format="json"),
    ):
        assert reply.status_code == 404, reply.json()
    assert sorted(Fact.objects.values_list("id", "content", "confidence")) == facts_before
    assert script.calls["dream"] == 1
