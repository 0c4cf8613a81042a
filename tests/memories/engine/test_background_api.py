"""/api/v1/engine/ background endpoints: flush (202), updates, journal, dream, undo,
settings, summaries; owners isolated, invalid input 400 with nothing written, no LLM 503."""

from __future__ import annotations

import logging

import pytest
from django.utils import timezone

from ingestion.updates import updates_run
from memories.engine.facade import MemoryEngine
from memories.engine.models import Dream, PendingUpdate
from memories.facts.models import Fact, Scope
from tests.memories.engine.scripted import EngineLLM, fact

pytestmark = pytest.mark.django_db
SCOPE = ["org", "acme", "agent-1"]
SAID = "I prefer short answers"


@pytest.fixture
def engine_llm(llm_settings, openai_server, engine_storage):
    script = EngineLLM(
        {SAID: [fact("User prefers short answers", "preference", 0.9)]},
        dream=lambda prompt: {"facts": [], "diary": "nothing to keep"},
    )
    openai_server.chat_fn = script
    return script


def _flush(client, scope=SCOPE, messages=None):
    return client.post("/api/v1/engine/flush", {
        "scope": scope, "messages": messages or [{"role": "user", "content": SAID}],
    }, format="json")  # fmt: skip


def _process(owner):
    for scope_id in set(
        PendingUpdate.objects.filter(owner=owner).values_list("scope_id", flat=True)
    ):
        updates_run(scope_id=scope_id, force=True)


def test_flush_answers_202_at_once_and_coalesces(alice, alice_client, engine_llm):
    first = _flush(alice_client)
    second = _flush(alice_client, messages=[{"role": "user", "content": "and in English"}])
    assert first.status_code == second.status_code == 202
    body = second.json()
    assert (body["scope"], body["status"], body["source"], body["pending_in_scope"]) == (
        SCOPE, "pending", "api", 2,
    )  # fmt: skip
    assert engine_llm.calls["extraction"] == 0
    _process(alice)
    assert engine_llm.calls["extraction"] == 1
    updates = alice_client.get("/api/v1/engine/updates", {"scope": SCOPE}).json()["results"]
    assert [u["status"] for u in updates] == ["done", "done"]
    assert updates[0]["batch_id"] == updates[1]["batch_id"]
    facts = alice_client.get("/api/v1/engine/facts", {"scope": SCOPE}).json()["results"]
    assert [(f["content"], f["category"], f["confidence"]) for f in facts] == [
        ("User prefers short answers", "preference", 0.9)
    ]


def test_flush_validates_and_writes_nothing(alice_client, engine_llm):
    bad = [
        {"scope": SCOPE, "messages": []},
        {"scope": SCOPE, "messages": [{"role": "robot", "content": "x"}]},
        {"scope": SCOPE, "messages": [{"role": "user", "content": ""}]},
        {"scope": [], "messages": [{"role": "user", "content": "x"}]},
        {"scope": ["user", "../etc"], "messages": [{"role": "user", "content": "x"}]},
        {"scope": ["memories", "{user_id}"], "messages": [{"role": "user", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}]},
    ]
    for payload in bad:
        response = alice_client.post("/api/v1/engine/flush", payload, format="json")
        assert response.status_code == 400, payload
        assert set(response.json()["error"]) == {"code", "message", "details"}
    assert PendingUpdate.objects.count() == 0


def test_scope_templates_fill_from_values(alice, alice_client, engine_llm):
    response = alice_client.post("/api/v1/engine/flush", {
        "scope": ["memories", "{user_id}"], "scope_values": {"user_id": "u-9"},
        "messages": [{"role": "user", "content": SAID}]}, format="json")  # fmt: skip
    assert response.status_code == 202 and response.json()["scope"] == ["memories", "u-9"]


def test_an_expected_503_is_logged_as_a_warning_not_an_error(
    alice_client, settings, engine_storage, caplog
):
    settings.LLM_BASE_URL = ""
    with caplog.at_level(logging.INFO, logger="django.request"):
        response = alice_client.post("/api/v1/engine/dream", {"scope": SCOPE}, format="json")
    assert response.status_code == 503
    logged = [(r.levelname, r.status_code) for r in caplog.records if r.name == "django.request"]
    assert logged == [("WARNING", 503)]


def test_without_an_llm_flush_and_dream_are_503_and_the_rest_works(
    alice,
    alice_client,
    settings,
    engine_storage,
):
    settings.LLM_BASE_URL = ""
    for url, payload in (("/api/v1/engine/flush", {"scope": SCOPE, "messages": [{"role": "user", "content": SAID}]}),
                         ("/api/v1/engine/dream", {"scope": SCOPE})):  # fmt: skip
        response = alice_client.post(url, payload, format="json")
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "not_configured" and "LLM_BASE_URL" in error["message"]
    assert PendingUpdate.objects.count() == 0 and Dream.objects.count() == 0
    created = alice_client.post("/api/v1/engine/facts", {"scope": SCOPE, "content": "User likes tea"},
                                format="json")  # fmt: skip
    assert created.status_code == 201
    assert alice_client.get("/api/v1/engine/settings").json() == {
        "dream_schedule": True, "memory_tools": False}  # fmt: skip
    summary = alice_client.post("/api/v1/engine/summaries", {
        "scope": SCOPE, "conversation_id": "c1", "max_tokens": 500,
        "messages": [{"id": "1", "role": "user", "content": "hello"}]}, format="json")  # fmt: skip
    assert summary.status_code == 200 and summary.json()["llm_calls"] == 0


def test_journal_show_download_and_owner_isolation(alice, alice_client, bob_client, engine_llm):
    _flush(alice_client)
    _process(alice)
    today = timezone.now().date().isoformat()
    days = alice_client.get("/api/v1/engine/journal", {"scope": SCOPE}).json()
    assert days == {"scope": SCOPE, "days": [today]}
    shown = alice_client.get("/api/v1/engine/journal", {"scope": SCOPE, "date": today}).json()
    assert shown["markdown"].startswith(f"# Journal · org/acme/agent-1 · {today}\n\n## ")
    assert f"- **user**: {SAID}\n" in shown["markdown"]
    download = alice_client.get(
        "/api/v1/engine/journal", {"scope": SCOPE, "date": today, "download": "1"}
    )
    assert (
        download.status_code == 200 and download["Content-Type"] == "text/markdown; charset=utf-8"
    )
    assert (
        download["Content-Disposition"]
        == f'attachment; filename="journal-org-acme-agent-1-{today}.md"'
    )
    assert download.content.decode() == shown["markdown"]
    listed = alice_client.get(
        "/api/v1/engine/journal", {"scope": SCOPE, "date": today, "download": "0"}
    )
    assert listed.json()["markdown"] == shown["markdown"]
    refused = alice_client.get(
        "/api/v1/engine/journal", {"scope": SCOPE, "date": today, "download": "yes"}
    )
    assert refused.status_code == 400  # (it showed the day, as if download were false)
    assert refused.json()["error"]["details"] == {"download": ["true, false, 1 or 0"]}
    undated = alice_client.get("/api/v1/engine/journal", {"scope": SCOPE, "download": "1"})
    assert undated.status_code == 400  # (it answered the list of days)
    assert undated.json()["error"]["details"] == {
        "date": ["a download is of one day's journal: give its date"]
    }
    as_json = alice_client.get(
        "/api/v1/engine/journal", {"scope": '["org","acme","agent-1"]', "date": today}
    )
    assert as_json.json()["markdown"] == shown["markdown"]

    missing = alice_client.get("/api/v1/engine/journal", {"scope": SCOPE, "date": "2001-01-01"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "journal_not_found"
    bad = alice_client.get("/api/v1/engine/journal", {"scope": SCOPE, "date": "yesterday"})
    assert bad.status_code == 400
    other = bob_client.get("/api/v1/engine/journal", {"scope": SCOPE, "date": today})
    assert other.status_code == 404 and other.json()["error"]["code"] == "scope_not_found"


def test_dream_undo_and_settings_over_rest(alice, alice_client, bob_client, engine_llm):
    engine = MemoryEngine(owner=alice)
    engine.manage(SCOPE, "User likes tea", category="preference")
    engine.manage(SCOPE, "User likes coffee", category="preference")
    engine_llm.dream = lambda prompt: {"facts": [], "diary": "dropped everything"}
    refused = alice_client.post("/api/v1/engine/dream", {"scope": SCOPE}, format="json")
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "dream_too_lossy"

    engine_llm.dream = lambda prompt: {
        "facts": [
            {
                "id": None,
                "content": "User likes hot drinks",
                "category": "preference",
                "confidence": 0.9,
            }
        ]
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("django.conf.settings.ENGINE_DREAM_MAX_DROP", 1.0)
        dreamed = alice_client.post(
            "/api/v1/engine/dream", {"scope": SCOPE, "lookback_days": 2}, format="json"
        )
    assert dreamed.status_code == 201
    body = dreamed.json()
    assert body["skipped"] is False and body["lookback_days"] == 2
    assert sorted(c["action"] for c in body["changes"]) == ["add", "delete", "delete"]
    assert "- [0.90] User likes hot drinks" in body["memory_md_after"]
    assert Fact.objects.filter(owner=alice).count() == 1

    dream_id = body["id"]
    assert bob_client.post(f"/api/v1/engine/dreams/{dream_id}/undo").status_code == 404
    assert bob_client.get(f"/api/v1/engine/dreams/{dream_id}").status_code == 404
    assert Fact.objects.filter(owner=alice).count() == 1
    listed = alice_client.get("/api/v1/engine/dreams", {"scope": SCOPE}).json()["results"]
    assert [d["id"] for d in listed] == [dream_id]
    undone = alice_client.post(f"/api/v1/engine/dreams/{dream_id}/undo")
    assert undone.status_code == 200 and undone.json()["status"] == "undone"
    assert sorted(Fact.objects.filter(owner=alice).values_list("content", flat=True)) == [
        "User likes coffee", "User likes tea"]  # fmt: skip
    again = alice_client.post(f"/api/v1/engine/dreams/{dream_id}/undo")
    assert again.status_code == 409 and again.json()["error"]["code"] == "dream_not_undoable"

    off = alice_client.patch("/api/v1/engine/settings", {"dream_schedule": False}, format="json")
    assert off.json() == {"dream_schedule": False, "memory_tools": False}
    tools = alice_client.patch("/api/v1/engine/settings", {"memory_tools": True}, format="json")
    assert tools.json() == {"dream_schedule": False, "memory_tools": True}  # the other kept
    assert bob_client.get("/api/v1/engine/settings").json() == {
        "dream_schedule": True, "memory_tools": False}  # fmt: skip
    for bad, field in (({"dream_schedule": "maybe"}, "dream_schedule"),
                       ({"memory_tools": False, "dreams": False}, "dreams"),
                       ({}, "non_field_errors")):  # fmt: skip
        refused = alice_client.patch("/api/v1/engine/settings", bad, format="json")
        assert refused.status_code == 400 and field in refused.json()["error"]["details"]
    kept = {"dream_schedule": False, "memory_tools": True}  # the refused changed nothing
    assert alice_client.get("/api/v1/engine/settings").json() == kept
    unknown = alice_client.post(
        "/api/v1/engine/dream", {"scope": ["user", "nobody"]}, format="json"
    )
    assert unknown.status_code == 404


def test_summaries_endpoint_keeps_a_running_summary(alice, alice_client, bob_client, engine_llm):
    messages = [{"id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant",
                 "content": f"turn {i} " + "word " * 25} for i in range(8)]  # fmt: skip
    payload = {"scope": SCOPE, "conversation_id": "c1", "messages": messages, "max_tokens": 120,
               "max_summary_tokens": 30}  # fmt: skip
    first = alice_client.post("/api/v1/engine/summaries", payload, format="json").json()
    assert first["llm_calls"] == 1 and first["folded_now"][0] == "m0"
    running = first["running_summary"]
    assert running["summarized_message_ids"] == first["folded_now"]
    assert first["messages"][0]["role"] == "system"
    assert first["messages"][-1]["content"].startswith("turn 7")
    # bob's conversation "c1" is another conversation
    bob = bob_client.post("/api/v1/engine/summaries", payload, format="json").json()
    assert bob["running_summary"]["summarized_message_ids"] == first["folded_now"]
    assert engine_llm.calls["summary"] == 2
    invalid = alice_client.post(
        "/api/v1/engine/summaries", {**payload, "conversation_id": ""}, format="json"
    )
    assert invalid.status_code == 400
    both = alice_client.post("/api/v1/engine/summaries", {**payload, "conversation": {
        "flow": "00000000-0000-0000-0000-000000000000", "session_id": "s"}}, format="json")  # fmt: skip
    assert both.status_code == 400


@pytest.mark.parametrize("bad", ["not-a-uuid", "42", "00000000-0000-0000-0000-00000000000g"])
def test_a_malformed_dream_id_is_a_json_404_and_undoes_nothing(alice, alice_client, bad):
    from memories.facts.scopes import scope_ensure

    row = scope_ensure(owner=alice, scope=SCOPE)
    dream = Dream.objects.create(owner=alice, scope=row, lookback_days=1, input_hash="x" * 64)
    not_found = {"error": {"code": "not_found", "message": "Not found.", "details": None}}
    for response in (
        alice_client.get(f"/api/v1/engine/dreams/{bad}"),
        alice_client.post(f"/api/v1/engine/dreams/{bad}/undo"),
    ):
        assert response.status_code == 404
        assert response.json() == not_found
    dream.refresh_from_db()
    assert dream.status == Dream.Status.APPLIED
    assert list(Dream.objects.values_list("pk", flat=True)) == [dream.pk]
    # A well-formed id reaches the view.
    assert alice_client.get(f"/api/v1/engine/dreams/{dream.pk}").json()["id"] == str(dream.pk)


def test_summary_messages_need_ids_of_their_own(alice, alice_client, engine_llm):
    """A message sent without an id was given its place in the list as one: the next
    call's new messages then read as folded already and were lost (200, nothing folded,
    in neither the summary nor the kept messages). Ids repeated in a call folded again."""
    from memories.conversations.models import ConversationSummary

    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"turn {i} " + "word " * 25} for i in range(8)]  # fmt: skip
    payload = {"scope": SCOPE, "conversation_id": "c-ids", "messages": messages,
               "max_tokens": 120, "max_summary_tokens": 30}  # fmt: skip
    missing = alice_client.post("/api/v1/engine/summaries", payload, format="json")
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "messages[0].id: This field is required."
    repeated = [{**m, "id": "a" if i < 2 else f"m{i}"} for i, m in enumerate(messages)]
    twice = alice_client.post("/api/v1/engine/summaries", {**payload, "messages": repeated},
                              format="json")  # fmt: skip
    assert twice.status_code == 400
    assert twice.json()["error"]["details"] == {"messages": ["message ids must differ: 'a' repeat"]}
    assert engine_llm.calls["summary"] == 0 and not ConversationSummary.objects.exists()


def test_a_summary_of_a_new_scope_makes_the_scope_so_erasure_finds_it(alice, alice_client,
                                                                       engine_llm):  # fmt: skip
    """The summary of a scope nobody had written to was kept with no scope row: both
    erasure doors answered 404 and the summarised text stayed."""
    from memories.conversations.models import ConversationSummary

    ghost = ["user", "ghost"]
    messages = [{"id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant",
                 "content": f"secret turn {i} " + "word " * 25} for i in range(8)]  # fmt: skip
    payload = {"scope": ghost, "conversation_id": "g-1", "messages": messages,
               "max_tokens": 120, "max_summary_tokens": 30}  # fmt: skip
    # within budget: nothing stored, no scope made
    small = alice_client.post("/api/v1/engine/summaries", {**payload, "max_tokens": 100_000},
                              format="json")  # fmt: skip
    assert small.status_code == 200 and small.json()["llm_calls"] == 0
    assert not Scope.objects.filter(owner=alice, path=ghost).exists()
    folded = alice_client.post("/api/v1/engine/summaries", payload, format="json")
    assert folded.status_code == 200 and folded.json()["llm_calls"] == 1
    assert Scope.objects.filter(owner=alice, path=ghost).exists()
    assert ConversationSummary.objects.filter(owner=alice).count() == 1
    erased = alice_client.delete("/api/v1/users/ghost/memories")
    assert erased.status_code == 200, erased.json()
    assert not ConversationSummary.objects.filter(owner=alice).exists()


def test_facts_learned_from_a_flush_were_observed_when_it_was_said(alice, alice_client,
                                                                   engine_llm):  # fmt: skip
    """A backfilled conversation's ``at`` dated its journal entry, but its facts were
    observed when the run came (decay and the date cue then read the wrong day)."""
    march = "2026-03-01T10:00:00"
    flushed = _flush(alice_client, messages=[{"role": "user", "content": SAID, "at": march}])
    assert flushed.status_code == 202
    _process(alice)
    [learned] = Fact.objects.filter(owner=alice)
    assert learned.observed_at.isoformat() == "2026-03-01T10:00:00+00:00"
    # without an `at`: when the flush came, not when the run did
    later = _flush(alice_client, scope=["org", "acme", "agent-2"])
    assert later.status_code == 202
    came = PendingUpdate.objects.get(owner=alice, scope__path=["org", "acme", "agent-2"])
    _process(alice)
    [second] = Fact.objects.filter(owner=alice, links__scope__path=["org", "acme", "agent-2"])
    assert second.observed_at == came.created_at


def test_a_message_said_with_an_offset_is_journaled_on_its_utc_day(alice, alice_client,
                                                                   engine_llm):  # fmt: skip
    """01:00+05:00 is 20:00 UTC the day before: its fact was observed then, but its
    journal entry was the local day's, headed "01:00:00 UTC"."""
    said = "2025-03-02T01:00:00+05:00"
    flushed = _flush(alice_client, messages=[{"role": "user", "content": SAID, "at": said}])
    assert flushed.status_code == 202
    _process(alice)
    assert Fact.objects.get(owner=alice).observed_at.isoformat() == "2025-03-01T20:00:00+00:00"
    days = alice_client.get("/api/v1/engine/journal", {"scope": SCOPE}).json()
    assert days == {"scope": SCOPE, "days": ["2025-03-01"]}
    shown = alice_client.get("/api/v1/engine/journal", {"scope": SCOPE, "date": "2025-03-01"})
    markdown = shown.json()["markdown"]
    assert markdown.startswith("# Journal · org/acme/agent-1 · 2025-03-01\n")
    assert "\n## 20:00:00 UTC · api\n" in markdown


def test_a_flush_error_names_its_field_with_a_list_of_words(alice_client, engine_llm):
    """The API's error shape: each field's messages as a list, the field named by its
    path (a flush's were strings inside nested objects, or a flat key of another form)."""
    cases = [
        ([{"role": "user", "content": " "}], "messages[0].content", "must be a non-empty string"),
        ([{"role": "robot", "content": "x"}], "messages[0].role",
         "must be one of user, assistant, system, tool"),
        ([{"role": "user", "content": "x", "at": 5}], "messages[0].at",
         "must be an ISO 8601 time"),
    ]  # fmt: skip
    for messages, path, said in cases:
        answer = _flush(alice_client, messages=messages)
        assert answer.status_code == 400
        assert answer.json()["error"]["details"] == {path: [said]}
        assert answer.json()["error"]["message"] == f"{path}: {said}"
    assert PendingUpdate.objects.count() == 0


def test_a_flush_message_refuses_a_key_that_names_no_field(alice, alice_client, engine_llm):
    """ "confidance": 0.9 in a message answered 202 and was dropped, where the summaries'
    and the user memories' messages refuse it; an OpenAI message's keys are dropped."""
    message = {"role": "user", "content": SAID}
    answer = _flush(alice_client, messages=[{**message, "confidance": 0.9}])
    assert answer.status_code == 400
    said = "Unknown field confidance."
    assert answer.json()["error"]["details"] == {"messages[0].confidance": [said]}
    assert answer.json()["error"]["message"] == f"messages[0].confidance: {said}"
    assert PendingUpdate.objects.count() == 0 and not Scope.objects.filter(path=SCOPE).exists()
    named = _flush(alice_client, messages=[{**message, "name": "ann", "tool_call_id": None}])
    assert named.status_code == 202
    # an OpenAI SDK's model_dump() of a reply, as an agent keeps it (and a reasoning model's)
    dumped = {"role": "assistant", "content": "Noted.", "refusal": None, "annotations": [],
              "audio": None, "function_call": None, "tool_calls": None,
              "reasoning_content": "..."}  # fmt: skip
    assert _flush(alice_client, messages=[dumped]).status_code == 202
    assert PendingUpdate.objects.order_by("id").last().messages == [
        {"role": "assistant", "content": "Noted."}
    ]
    assert PendingUpdate.objects.order_by("id").first().messages == [message]


def test_a_message_said_in_the_future_was_said_when_its_flush_came(alice, alice_client,
                                                                   engine_llm):  # fmt: skip
    flushed = _flush(alice_client, messages=[
        {"role": "user", "content": SAID, "at": "2099-01-01T00:00:00"}])  # fmt: skip
    assert flushed.status_code == 202
    came = PendingUpdate.objects.get(owner=alice)
    _process(alice)
    assert Fact.objects.get(owner=alice).observed_at == came.created_at


def test_a_summary_body_refuses_unknown_keys_in_its_objects(alice, alice_client, flow,
                                                            engine_llm):  # fmt: skip
    """A conversation object (or a message) with a key that names no field answered 200:
    a misspelt "session" summarised nothing asked for, silently."""
    from memories.conversations.models import ConversationSummary

    base = {"scope": SCOPE, "max_tokens": 120, "max_summary_tokens": 30}
    unknown = alice_client.post("/api/v1/engine/summaries", {**base, "conversation": {
        "flow": str(flow.pk), "session_id": "s", "x": 1}}, format="json")  # fmt: skip
    assert unknown.status_code == 400
    assert unknown.json()["error"]["details"] == {"conversation": {"x": ["Unknown field x."]}}
    message = {"id": "m0", "role": "user", "content": "hello"}
    wrong = alice_client.post("/api/v1/engine/summaries", {**base, "conversation_id": "c",
                              "messages": [{**message, "x": 1}]}, format="json")  # fmt: skip
    assert wrong.status_code == 400
    assert wrong.json()["error"]["details"] == {"messages": {"0": {"x": ["Unknown field x."]}}}
    assert engine_llm.calls["summary"] == 0 and not ConversationSummary.objects.exists()
    # an OpenAI message's other keys are taken and dropped, as a run's messages do
    named = alice_client.post("/api/v1/engine/summaries", {**base, "conversation_id": "c",
                              "messages": [{**message, "name": "ann"}]}, format="json")  # fmt: skip
    assert named.status_code == 200
    assert named.json()["messages"] == [{"role": "user", "content": "hello"}]


def test_an_empty_conversation_summarises_to_nothing_costing_nothing(alice, alice_client, flow,
                                                                     engine_llm):  # fmt: skip
    """messages: [] answered token_count 3 (the reply priming of nothing), where the
    history of an empty conversation answers 0."""
    base = {"scope": SCOPE, "max_tokens": 120, "max_summary_tokens": 30}
    empty = alice_client.post("/api/v1/engine/summaries", {**base, "conversation_id": "c",
                              "messages": []}, format="json").json()  # fmt: skip
    stored = alice_client.post("/api/v1/engine/summaries", {**base, "conversation": {
        "flow": str(flow.pk), "session_id": "none"}}, format="json").json()  # fmt: skip
    history = alice_client.get(f"/api/v1/conversations/none/history?flow={flow.pk}"
                               "&strategy=summarize&max_tokens=120&max_summary_tokens=30").json()  # fmt: skip
    nothing = {"text": "", "summarized_message_ids": [], "last_summarized_message_id": ""}
    for answer in (empty, stored):
        assert (answer["messages"], answer["token_count"], answer["running_summary"],
                answer["llm_calls"]) == ([], 0, nothing, 0)  # fmt: skip
    assert (history["messages"], history["token_count"]) == ([], 0)
    assert engine_llm.calls["summary"] == 0
