"""Context summaries: the running summary grows incrementally, the latest human message
is never folded away, the stored state advances once, and the history endpoint offers
strategy=summarize next to truncation."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from core.errors import InvalidInput
from core.models import UsageDay
from core.providers.errors import ProviderNotConfigured
from core.providers.tokens import count_tokens, truncate_to_tokens
from core.services import api_key_create
from memories.bases.services import messages_record
from memories.conversations.models import ConversationSummary, Message
from memories.conversations.services import MessageIn
from memories.conversations.summaries import SummaryMessage, summary_fold
from tests.conftest import record
from tests.fakes.openai_server import Scripted, chat_body
from tests.memories.engine.scripted import EngineLLM

pytestmark = pytest.mark.django_db


def turns(n: int, start: int = 0) -> list[SummaryMessage]:
    out = []
    for i in range(start, start + n):
        role = "user" if i % 2 == 0 else "assistant"
        out.append(SummaryMessage(f"m{i}", role, f"message number {i} " + "word " * 20))
    return out


@pytest.fixture
def summarizer(llm_settings, openai_server):
    script = EngineLLM()
    openai_server.chat_fn = script
    return script


def test_within_budget_nothing_is_summarised(alice, summarizer):
    result = summary_fold(owner=alice, key="k", messages=turns(2), max_tokens=1000)
    assert (result.llm_calls, result.summary, [m.id for m in result.kept]) == (0, "", ["m0", "m1"])
    assert summarizer.calls["summary"] == 0 and not ConversationSummary.objects.exists()


def test_running_summary_grows_incrementally(alice, summarizer):
    first = summary_fold(owner=alice, key="k", messages=turns(10), max_tokens=150,
                         max_summary_tokens=40)  # fmt: skip
    assert first.llm_calls == 1 and first.folded == [f"m{i}" for i in range(len(first.folded))]
    assert first.token_count <= 150 or first.kept[0].role == "user"
    prompt = summarizer.prompts["summary"][0]
    assert prompt.startswith("Create a summary of the conversation below.")
    assert all(f"message number {i} " in prompt for i in range(len(first.folded)))
    assert f"message number {len(first.folded)} " not in prompt  # kept ones are not sent
    stored = ConversationSummary.objects.get()
    assert (stored.text, stored.summarized_ids, stored.last_summarized_id) == (
        first.summary, first.folded, first.folded[-1],
    )  # fmt: skip
    # Its tokens are counted for the owner (issue 29), from the answer's usage.
    counted = UsageDay.objects.values_list("owner", "kind", "subject", "calls", "tokens_in")
    assert list(counted) == [(alice.pk, "summary", "k", 1, 10)]

    # the same call again: nothing new to fold, no LLM call
    same = summary_fold(
        owner=alice, key="k", messages=turns(10), max_tokens=150, max_summary_tokens=40
    )
    assert (
        same.llm_calls == 0 and same.summary == first.summary and summarizer.calls["summary"] == 1
    )

    # more messages: only the new ones are summarised, into the extended summary (LangMem #118)
    second = summary_fold(
        owner=alice, key="k", messages=turns(16), max_tokens=150, max_summary_tokens=40
    )
    assert second.llm_calls == 1
    extend = summarizer.prompts["summary"][1]
    assert extend.startswith(
        f"This is the summary of the conversation so far:\n{first.summary}\n\nExtend this summary"
    )
    assert all(
        f"message number {i} " not in extend.split("Extend this summary")[1]
        for i in range(len(first.folded))
    )
    assert second.summarized_ids == first.folded + second.folded
    assert second.folded[0] == f"m{len(first.folded)}"  # continues where the first stopped
    assert second.as_messages()[0] == {
        "role": "system",
        "content": "Summary of the earlier conversation:\n" + second.summary,
    }


def test_the_latest_human_message_is_never_summarised_away(alice, summarizer):
    """LangMem #77/#111: a long tail of assistant/tool output after the user's question."""
    messages = [*turns(4), SummaryMessage("q", "user", "What did I ask about the deployment?")]
    messages += [SummaryMessage(f"a{i}", "assistant", "long answer " * 60) for i in range(3)]
    result = summary_fold(
        owner=alice, key="k", messages=messages, max_tokens=100, max_summary_tokens=30
    )
    kept = [m.id for m in result.kept]
    assert kept == ["q", "a0", "a1", "a2"]  # over budget, but the question stays verbatim
    assert "q" not in result.summarized_ids and result.folded == ["m0", "m1", "m2", "m3"]
    # even alone and too big for the budget, it is kept
    huge = [SummaryMessage("big", "user", "please read this " * 200)]
    alone = summary_fold(owner=alice, key="k2", messages=huge, max_tokens=50, max_summary_tokens=10)
    assert [m.id for m in alone.kept] == ["big"] and alone.llm_calls == 0


def test_a_lost_race_does_not_fold_twice(alice, summarizer, monkeypatch):
    from memories.conversations import summaries

    real = summaries._summarise
    calls = []

    def racing(llm, summary, to_fold, budget):
        text = real(llm, summary, to_fold, budget)
        if not calls:  # another call stores its fold while this one waits for the LLM
            calls.append(1)
            ConversationSummary.objects.create(owner=alice, key="k", text="theirs", version=1,
                                               summarized_ids=[m.id for m in to_fold],
                                               last_summarized_id=to_fold[-1].id)  # fmt: skip
        return text

    monkeypatch.setattr(summaries, "_summarise", racing)
    result = summary_fold(
        owner=alice, key="k", messages=turns(10), max_tokens=150, max_summary_tokens=40
    )
    assert result.summary == "theirs" and result.llm_calls == 0
    assert ConversationSummary.objects.get().summarized_ids == result.summarized_ids


def test_bad_budgets_and_no_llm(alice, settings):
    for kwargs in ({"max_tokens": 0}, {"max_tokens": 100, "max_summary_tokens": 100},
                   {"max_tokens": 100, "max_tokens_before_summary": 50}, {"max_tokens": "x"}):  # fmt: skip
        with pytest.raises(InvalidInput):
            summary_fold(owner=alice, key="k", messages=turns(2), **kwargs)
    settings.LLM_BASE_URL = ""
    assert summary_fold(owner=alice, key="k", messages=turns(2), max_tokens=1000).llm_calls == 0
    with pytest.raises(ProviderNotConfigured) as err:
        summary_fold(
            owner=alice, key="k", messages=turns(20), max_tokens=100, max_summary_tokens=20
        )
    assert err.value.status_code == 503 and "LLM_BASE_URL" in str(err.value)
    assert not ConversationSummary.objects.exists()


def test_history_endpoint_strategy_summarize(alice, alice_client, bob_client, flow, summarizer):
    for i in range(6):
        record(flow, "s1", f"question {i} " + "word " * 30, run_id=f"r{i}", role="user")
        record(flow, "s1", f"answer {i} " + "word " * 30, run_id=f"r{i}")
    url = f"/api/v1/conversations/s1/history?flow={flow.pk}&max_tokens=200"
    truncated = alice_client.get(url).json()
    assert "summary" not in truncated and truncated["truncated"] > 0

    body = alice_client.get(url + "&strategy=summarize&max_summary_tokens=60").json()
    assert body["strategy"] == "summarize" and summarizer.calls["summary"] == 1
    summary = body["summary"]
    assert summary["text"].startswith("SUMMARY[user: question 0")
    assert body["messages"][0] == {
        "role": "system",
        "content": "Summary of the earlier conversation:\n" + summary["text"],
    }
    assert [m["content"] for m in body["messages"][1:]] == [i["content"] for i in body["items"]]
    assert body["items"][-1]["content"].startswith("answer 5")
    assert (
        len(summary["summarized_message_ids"]) + len(body["items"]) == body["thread_length"] == 12
    )
    assert summary["last_summarized_message_id"] == summary["summarized_message_ids"][-1]

    again = alice_client.get(url + "&strategy=summarize&max_summary_tokens=60").json()
    assert again["summary"]["text"] == summary["text"] and summarizer.calls["summary"] == 1
    assert bob_client.get(url + "&strategy=summarize").status_code == 404
    bad = alice_client.get(url + "&strategy=compress")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"


def test_a_read_only_key_may_not_summarize(alice, alice_client, flow, summarizer):
    """A read-only key's GET with strategy=summarize stored a running summary and spent
    LLM tokens (a full key's next call then saw the summary instead of the messages)."""
    for i in range(6):
        record(flow, "s1", f"question {i} " + "word " * 30, run_id=f"r{i}", role="user")
        record(flow, "s1", f"answer {i} " + "word " * 30, run_id=f"r{i}")
    _, raw = api_key_create(owner=alice, name="extension", read_only=True)
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    url = f"/api/v1/conversations/s1/history?flow={flow.pk}&max_tokens=200"

    refused = reader.get(url + "&strategy=summarize&max_summary_tokens=60")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "read_only_key"
    assert summarizer.calls["summary"] == 0 and not ConversationSummary.objects.exists()
    assert not UsageDay.objects.exists()
    # it still reads the truncated history, the same a full key reads
    assert reader.get(url).json() == alice_client.get(url).json()


def _say(flow, session_id: str, message_id: str, role: str, parent: str | None = None) -> None:
    text = f"{message_id} says " + "word " * 30
    extra = {} if parent is None else {"parent": parent}
    messages_record(flow=flow, session_id=session_id, run_id=message_id,
                    messages=[MessageIn(role=role, text=text, message_id=message_id, **extra)])  # fmt: skip


def _ids(flow, session_id: str, *message_ids: str) -> list[str]:
    pk = dict(Message.objects.filter(flow=flow, session_id=session_id)
              .values_list("message_id", "pk"))  # fmt: skip
    return [str(pk[m]) for m in message_ids]


def test_a_regenerated_thread_does_not_extend_the_old_branchs_summary(alice_client, flow,
                                                                       summarizer):  # fmt: skip
    """The running summary was per conversation: after a regeneration the newest thread
    extended the summary of messages that were never on it (a1), and sent them to the LLM."""
    for message_id, role in (("q1", "user"), ("a1", "assistant"), ("q2", "user"),
                             ("a2", "assistant")):  # fmt: skip
        _say(flow, "br", message_id, role)
    url = (f"/api/v1/conversations/br/history?flow={flow.pk}&strategy=summarize&max_tokens=100"
           "&max_summary_tokens=20")  # fmt: skip
    old = alice_client.get(url).json()
    assert old["summary"]["summarized_message_ids"] == _ids(flow, "br", "q1", "a1")
    _say(flow, "br", "a1b", "assistant", parent="q1")  # a regeneration of a1
    _say(flow, "br", "q3", "user", parent="a1b")

    new = alice_client.get(url).json()
    assert [i["message_id"] for i in new["items"]] == ["q3"]
    assert new["summary"]["summarized_message_ids"] == _ids(flow, "br", "q1", "a1b")
    assert new["summary"]["folded_now"] == _ids(flow, "br", "q1", "a1b")
    prompt = summarizer.prompts["summary"][1]
    assert prompt.startswith("Create a summary of the conversation below.")
    assert "q1 says" in prompt and "a1b says" in prompt and "a1 says" not in prompt
    # the stored summary now follows the newest thread (replaced, by a conditional update)
    stored = ConversationSummary.objects.get()
    assert (stored.summarized_ids, stored.last_summarized_id, stored.text, stored.version) == (
        _ids(flow, "br", "q1", "a1b"), _ids(flow, "br", "a1b")[0], new["summary"]["text"], 2,
    )  # fmt: skip

    # the old branch again: its own summary, from its own messages, not stored
    branch = alice_client.get(url + "&current_message_id=a2").json()
    assert [i["message_id"] for i in branch["items"]] == ["q2", "a2"]
    assert branch["summary"]["summarized_message_ids"] == _ids(flow, "br", "q1", "a1")
    prompt = summarizer.prompts["summary"][2]
    assert prompt.startswith("Create a summary of the conversation below.")
    assert "a1 says" in prompt and "a1b says" not in prompt
    assert summarizer.calls["summary"] == 3
    assert ConversationSummary.objects.get().version == 2


def test_an_earlier_message_gets_no_summary_of_later_ones(alice_client, flow, summarizer):
    """With the current message early in the conversation, the stored summary of later
    messages was answered, summarising the future and dropping the current question."""
    for i in range(12):
        _say(flow, "s", f"m{i}", "user" if i % 2 == 0 else "assistant")
    url = (f"/api/v1/conversations/s/history?flow={flow.pk}&strategy=summarize&max_tokens=150"
           "&max_summary_tokens=20")  # fmt: skip
    newest = alice_client.get(url).json()
    folded = newest["summary"]["summarized_message_ids"]
    assert folded == _ids(flow, "s", *(f"m{i}" for i in range(len(folded)))) and len(folded) > 3

    early = alice_client.get(url + "&current_message_id=m2").json()
    assert [i["message_id"] for i in early["items"]] == ["m0", "m1", "m2"]
    assert early["summary"] == {"text": "", "summarized_message_ids": [],
                                "last_summarized_message_id": "", "folded_now": [],
                                "llm_calls": 0}  # fmt: skip
    assert [m["content"][:8] for m in early["messages"]] == ["m0 says ", "m1 says ", "m2 says "]
    # a later message whose thread starts with the folded ones uses the stored summary
    later = alice_client.get(url + f"&current_message_id=m{len(folded) + 1}").json()
    assert later["summary"]["summarized_message_ids"] == folded
    assert [i["message_id"] for i in later["items"]] == [f"m{len(folded)}", f"m{len(folded) + 1}"]
    assert summarizer.calls["summary"] == 1
    assert ConversationSummary.objects.get().summarized_ids == folded


def test_a_longer_stored_summary_is_cut_to_the_calls_max_summary_tokens(alice, openai_server,
                                                                         llm_settings):  # fmt: skip
    """A summary stored with max_summary_tokens=150, used by a call with 20, was answered
    whole: token_count went past max_tokens with nothing protected to excuse it."""
    openai_server.chat_fn = lambda payload: Scripted(body=chat_body("long summary " * 200))
    first = summary_fold(owner=alice, key="k", messages=turns(12), max_tokens=300,
                         max_summary_tokens=150)  # fmt: skip
    stored = ConversationSummary.objects.get()
    assert first.llm_calls == 1 and count_tokens(stored.text) == 150
    assert first.folded == [f"m{i}" for i in range(8)] and first.token_count == 279

    second = summary_fold(owner=alice, key="k", messages=turns(12), max_tokens=200,
                          max_summary_tokens=20)  # fmt: skip
    assert second.llm_calls == 0 and second.summary == truncate_to_tokens(stored.text, 20)
    assert [m.id for m in second.kept] == ["m8", "m9", "m10", "m11"]
    # 3 + the summary (3 + 1 + 6 + 20) + the kept (4 * 29): within max_tokens
    assert count_tokens(second.summary) == 20 and second.token_count == 149
    # the stored summary is not rewritten: a call with a larger budget gets it whole
    again = ConversationSummary.objects.get()
    assert (again.text, again.version, again.summarized_ids) == (stored.text, 1, first.folded)


def test_a_summarized_history_as_text_begins_with_the_summary(alice_client, flow, summarizer):
    """format=text began with the kept messages: the folded ones were neither there nor
    summarised, though token_count counted the summary."""
    for i in range(6):
        record(flow, "s1", f"question {i} " + "word " * 30, run_id=f"r{i}", role="user")
        record(flow, "s1", f"answer {i} " + "word " * 30, run_id=f"r{i}")
    url = (f"/api/v1/conversations/s1/history?flow={flow.pk}&max_tokens=200&strategy=summarize"
           "&max_summary_tokens=60")  # fmt: skip
    messages = alice_client.get(url).json()
    text = alice_client.get(url + "&format=text&human_prefix=User&ai_prefix=Bot").json()
    summary = messages["summary"]["text"]
    assert summary.startswith("SUMMARY[user: question 0") and summarizer.calls["summary"] == 1
    lines = [f"User: {i['content']}" if i["role"] == "user" else f"Bot: {i['content']}"
             for i in messages["items"]]  # fmt: skip
    assert text["text"] == "\n".join(
        ["System: Summary of the earlier conversation:\n" + summary, *lines]
    )
    assert text["token_count"] == messages["token_count"] and text["items"] == messages["items"]
    assert (
        text["summary"]["summarized_message_ids"] == messages["summary"]["summarized_message_ids"]
    )
    assert text["summary"]["llm_calls"] == 0 and summarizer.calls["summary"] == 1


def test_a_window_that_moved_past_the_folded_messages_keeps_the_summary(alice_client, flow,
                                                                         summarizer):  # fmt: skip
    """With message_limit, once the thread grew past the last folded message the stored
    summary was judged another thread's: left out of the answer, then replaced by one of
    the window alone (the summary of the older messages lost)."""
    for i in range(6):
        _say(flow, "s", f"m{i}", "user" if i % 2 == 0 else "assistant")
    url = (f"/api/v1/conversations/s/history?flow={flow.pk}&strategy=summarize&max_tokens=150"
           "&max_summary_tokens=20&message_limit=6")  # fmt: skip
    first = alice_client.get(url).json()["summary"]
    assert first["summarized_message_ids"] and summarizer.calls["summary"] == 1
    for i in range(6, 14):  # the window of 6 now holds none of the folded messages
        _say(flow, "s", f"m{i}", "user" if i % 2 == 0 else "assistant")
    later = alice_client.get(url).json()
    folded = later["summary"]["summarized_message_ids"]
    assert folded[: len(first["summarized_message_ids"])] == first["summarized_message_ids"]
    assert later["messages"][0]["role"] == "system" and summarizer.calls["summary"] == 2
    stored = ConversationSummary.objects.get()
    assert stored.summarized_ids == folded and stored.version == 2  # extended, not replaced


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("door", ["history", "engine"])
def test_a_session_deleted_while_it_is_summarised_keeps_no_summary(alice_client, flow, door,
                                                                   summarizer, openai_server):  # fmt: skip
    """The deletion committed while the LLM folded; the fold then stored a summary of the
    deleted messages, served to the next conversation of that id. Through the history's
    strategy=summarize, and through ``POST /engine/summaries`` naming the conversation
    (which still stored it)."""
    from memories.bases.services import session_messages_delete

    for i in range(8):
        _say(flow, "s", f"m{i}", "user" if i % 2 == 0 else "assistant")

    def delete_then_answer(payload):  # (the server's thread: its own connection commits)
        from django.db import connection

        try:
            session_messages_delete(flow=flow, session_id="s")
        finally:
            connection.close()  # (left open, it kept the test database from its teardown)
        return summarizer(payload)

    openai_server.chat_fn = delete_then_answer
    url = (f"/api/v1/conversations/s/history?flow={flow.pk}&strategy=summarize&max_tokens=150"
           "&max_summary_tokens=20")  # fmt: skip
    if door == "history":
        response = alice_client.get(url)
    else:
        response = alice_client.post("/api/v1/engine/summaries", {
            "scope": ["user", "u1"], "max_tokens": 150, "max_summary_tokens": 20,
            "conversation": {"flow": str(flow.pk), "session_id": "s"},
        }, format="json")  # fmt: skip
    assert response.status_code == 409, response.content
    assert response.json()["error"]["details"] == {"session_id": "s"}
    assert not ConversationSummary.objects.exists() and not Message.objects.exists()
    _say(flow, "s", "again", "user")  # the id starts afresh
    assert alice_client.get(url).json()["messages"][0]["content"].startswith("again says")


DOC_EXAMPLE = [  # docs/engine.md's
    SummaryMessage(
        "1", "user", "My order 77 is late: it was due Monday and I need it on Saturday."
    ),
    SummaryMessage("2", "assistant", "I asked the courier to deliver order 77 by Friday."),
    SummaryMessage("3", "user", "Thanks. Will I get a tracking link?"),
]


@pytest.mark.parametrize("answer", ["order 77 late, courier asked " * 40, "late order"])
def test_the_answer_stays_within_max_tokens_when_the_latest_human_message_fits(
    alice, openai_server, llm_settings, answer
):
    """The doc's example (max_tokens 40, max_summary_tokens 30) answered token_count 47:
    the summary's prefix and overheads came on top of its 30 tokens, and the kept
    question left it no room. The answer's summary is cut to the room left."""
    openai_server.chat_fn = lambda payload: Scripted(body=chat_body(answer))
    example = summary_fold(owner=alice, key="doc", messages=DOC_EXAMPLE, max_tokens=40,
                           max_summary_tokens=30)  # fmt: skip
    assert example.folded == ["1", "2"] and [m.id for m in example.kept] == ["3"]
    assert example.token_count <= 40 and example.summary
    assert ConversationSummary.objects.get(key="doc").text == truncate_to_tokens(answer, 30)
    long = [*turns(12), SummaryMessage("q", "user", "And the deployment? " * 5)]
    for limit, summary_budget in [(16, 1), (30, 12), (60, 50), (80, 20), (150, 140)]:
        key = f"k{limit}-{summary_budget}"
        result = summary_fold(owner=alice, key=key, messages=long, max_tokens=limit,
                              max_summary_tokens=summary_budget)  # fmt: skip
        tail = sum(m.cost for m in long[-1:]) + 3  # the question, primed
        assert result.token_count <= limit or tail > limit, (limit, summary_budget)
        again = summary_fold(owner=alice, key=key, messages=long, max_tokens=limit,
                             max_summary_tokens=summary_budget)  # fmt: skip
        assert again.llm_calls == 0 and (again.token_count <= limit or tail > limit)
