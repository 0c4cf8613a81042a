"""/v1/chat/completions driven by the official openai client against a live server,
with an OpenAI-compatible upstream on 127.0.0.1."""

from __future__ import annotations

from datetime import timedelta

import httpx
import openai
import pytest
from django.utils import timezone

from core.services import api_key_create
from memories.facts.models import Fact, FactLink, Scope
from memories.facts.scopes import end_user_ensure, global_scope_ensure
from tests.fakes.openai_server import Scripted, chat_body
from tests.memories.facts.conftest import scripted_llm
from tests.memories.facts.seed import seed

pytestmark = pytest.mark.django_db(transaction=True)
QUESTION = "Which JavaScript runtime should I use for my server?"


@pytest.fixture
def upstream(llm_settings, openai_server, fixture_embedder):
    llm_settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 0  # the formation asserted right after
    openai_server.chat_fn = scripted_llm({}, answer="Use Node.js, since you already know it.")
    return openai_server


def _client(live_server, owner, user_id=None, **kwargs):
    _, key = api_key_create(owner=owner)
    headers = {"X-OpenWebUI-User-Id": user_id} if user_id else {}
    return openai.OpenAI(
        base_url=live_server.url + "/v1",
        api_key=key,
        default_headers=headers,
        max_retries=0,
        **kwargs,
    )


def _seed(owner, user_id, *facts):
    end_user = end_user_ensure(owner=owner, external_id=user_id)
    return seed(end_user, *facts, observed_at=timezone.now() - timedelta(hours=1))


def _chat_requests(upstream):
    return [
        r for r in upstream.requests if "You maintain the long-term memory" not in str(r["json"])
    ]


def test_non_streaming_injects_memories_and_returns_upstream_answer(live_server, alice, upstream):
    node, _peanuts = _seed(alice, "u1", "User uses Node.js", "User is allergic to peanuts")
    completion = _client(live_server, alice, "u1").chat.completions.create(
        model="fake-model",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": QUESTION},
        ],
    )
    assert completion.choices[0].message.content == "Use Node.js, since you already know it."
    assert completion.model == "fake-model" and completion.usage.total_tokens == 15
    memories = completion.model_extra["memories"]
    # Issue 12: the block is the engine's injection: the facts relevant to the message
    # first (scored), then the rest by confidence while the budget lasts (unscored).
    assert [(m["id"], m["content"], m["relevant"]) for m in memories] == [
        (str(node.pk), "User uses Node.js", True),
        (str(_peanuts.pk), "User is allergic to peanuts", False),
    ]
    # The search's figures, as /api/v1/engine/search gives them (hybrid score, cosine).
    assert memories[0]["similarity"] == pytest.approx(0.441, abs=0.002)
    assert memories[0]["score"] > memories[0]["similarity"]
    assert (memories[1]["score"], memories[1]["similarity"]) == (None, None)
    assert set(memories[0]) == {"id", "content", "category", "confidence", "type", "relevant",
                                "score", "similarity"}  # fmt: skip
    assert (memories[0]["category"], memories[0]["confidence"], memories[0]["type"]) == (
        "context", 1.0, "memory",
    )  # fmt: skip
    (sent,) = _chat_requests(upstream)
    system = sent["json"]["messages"][0]
    assert system["role"] == "system" and system["content"].startswith(
        "Be brief.\n\nLong-term memories about the user"
    )
    assert system["content"].endswith(
        "\n- [context | 1.00] User uses Node.js\n- [context | 1.00] User is allergic to peanuts"
    )
    assert "ignore the rest" in system["content"]
    assert sent["json"]["messages"][1] == {"role": "user", "content": QUESTION}


def test_formation_runs_after_the_answer(live_server, alice, upstream):
    message = "I drink green tea every morning and I play the violin"
    upstream.chat_fn = scripted_llm(
        {message: ["User drinks green tea every morning"]}, answer="Nice!"
    )
    client = _client(live_server, alice, "u1")
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": message}]
    )
    end_user = Scope.objects.get(owner=alice, external_id="u1")
    assert list(Fact.objects.filter(links__scope=end_user).values_list("content", flat=True)) == [
        "User drinks green tea every morning"
    ]


def test_streaming_relays_chunks_and_forms_memories(live_server, alice, upstream):
    message = "I drink green tea every morning and I play the violin"
    upstream.chat_fn = scripted_llm({message: ["User plays the violin"]}, answer="Lovely hobbies!")
    stream = _client(live_server, alice, "u1").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": message}], stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == "Lovely hobbies!"
    assert _chat_requests(upstream)[0]["json"]["stream"] is True
    assert Fact.objects.filter(content="User plays the violin").count() == 1


@pytest.mark.parametrize("stream", [False, True])
def test_facts_learned_in_a_recorded_chat_name_the_recorded_message(
    live_server, alice, upstream, stream
):
    """With Open WebUI's chat id the turn is recorded as a conversation; the facts the
    debounced update learns from it carry the recorded user message's id as their
    source (kind "message")."""
    from memories.conversations.models import Message

    message = "I drink green tea every morning and I play the violin"
    upstream.chat_fn = scripted_llm({message: ["User plays the violin"]}, answer="Lovely!")
    client = _client(live_server, alice, "u1")
    answer = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": message}], stream=stream,
        extra_headers={"X-OpenWebUI-Chat-Id": "chat-1"},
    )  # fmt: skip
    if stream:
        assert "".join(c.choices[0].delta.content or "" for c in answer if c.choices) == "Lovely!"
    recorded = Message.objects.get(role="user", session_id="chat-1")
    fact = Fact.objects.get(content="User plays the violin")
    assert (fact.source_kind, fact.source_ref) == ("message", str(recorded.pk))


def test_user_field_identifies_the_end_user(live_server, alice, upstream):
    _seed(alice, "u7", "User uses Node.js")
    completion = _client(live_server, alice).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": QUESTION}], user="u7"
    )
    assert [m["content"] for m in completion.model_extra["memories"]] == ["User uses Node.js"]


def test_anonymous_mode_no_retrieval_no_formation(live_server, alice, upstream):
    _seed(alice, "u1", "User uses Node.js")
    completion = _client(live_server, alice).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": QUESTION}]
    )
    assert completion.choices[0].message.content == "Use Node.js, since you already know it."
    assert completion.model_extra["memories"] == []
    assert len(upstream.requests) == 1  # the answer only: no extraction call
    assert upstream.requests[0]["json"]["messages"] == [{"role": "user", "content": QUESTION}]
    assert Scope.objects.count() == 1  # only the seeded user


def test_cold_start_globals_until_five_personal_memories(live_server, alice, upstream):
    seed(global_scope_ensure(owner=alice), "The support team is available on weekdays from 9 to 5")
    client = _client(live_server, alice, "newcomer")
    question = "When can I reach support?"
    cold = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": question}]
    )
    assert [m["type"] for m in cold.model_extra["memories"]] == ["global"]
    _seed(
        alice,
        "newcomer",
        "User works as a nurse",
        "User plays the violin",
        "User prefers dark mode",
        "User is allergic to peanuts",
        "User lives in New York",
    )
    warm = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": question}]
    )
    # no global any more; the user's own facts (none relevant) fill the block (issue 12)
    assert [(m["type"], m["relevant"]) for m in warm.model_extra["memories"]] == [
        ("memory", False)
    ] * 5


def test_memory_block_keeps_the_token_budget(live_server, alice, upstream, settings):
    from core.providers.tokens import count_tokens
    from memories.proxy.chat import MEMORY_BLOCK_HEADER

    facts = ["User uses Node.js", "User works as a nurse", "User plays the violin",
             "User prefers dark mode", "User is allergic to peanuts", "User lives in New York"]  # fmt: skip
    _seed(alice, "u1", *facts)
    settings.MEMORY_PROMPT_MAX_TOKENS = count_tokens(
        MEMORY_BLOCK_HEADER + "\n- [context | 1.00] User uses Node.js\n"
        "- [context | 1.00] User works as a nurse"
    )
    completion = _client(live_server, alice, "u1").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": QUESTION}]
    )
    memories = completion.model_extra["memories"]
    assert len(memories) == 2 and memories[0]["content"] == "User uses Node.js"
    (sent,) = _chat_requests(upstream)
    block = sent["json"]["messages"][0]["content"]
    assert count_tokens(block) <= settings.MEMORY_PROMPT_MAX_TOKENS
    assert block.startswith(MEMORY_BLOCK_HEADER) and block.count("\n- [") == 2


def test_isolation_between_users_and_owners(live_server, alice, bob, upstream):
    _seed(alice, "u1", "User uses Node.js")
    _seed(bob, "u2", "User uses Node.js")
    other_user = _client(live_server, alice, "u2").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": QUESTION}]
    )
    assert other_user.model_extra["memories"] == []
    other_owner = _client(live_server, bob, "u1").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": QUESTION}]
    )
    assert other_owner.model_extra["memories"] == []  # bob's "u1" is not alice's "u1"
    assert Scope.objects.filter(external_id="u1").count() == 2


@pytest.mark.parametrize(
    ("scripted", "status", "error_cls"),
    [
        (
            Scripted(status=429, body={"error": {"message": "slow down"}}),
            429,
            openai.RateLimitError,
        ),
        (
            Scripted(status=503, body={"error": {"message": "overloaded"}}),
            502,
            openai.InternalServerError,
        ),
        (
            Scripted(status=404, body={"error": {"message": "model 'nope' not found"}}),
            404,
            openai.NotFoundError,
        ),
    ],
)
def test_upstream_errors_map_to_openai_errors_and_write_nothing(
    live_server, alice, upstream, llm_settings, scripted, status, error_cls
):
    llm_settings.LLM_MAX_RETRIES = 0
    upstream.push(scripted)
    message = "I drink green tea every morning and I play the violin"
    with pytest.raises(error_cls) as info:
        _client(live_server, alice, "u1").chat.completions.create(
            model="nope", messages=[{"role": "user", "content": message}]
        )
    assert info.value.status_code == status
    body = info.value.body
    assert set(body) >= {"message", "type", "code"}
    assert not Fact.objects.exists() and not FactLink.objects.exists()
    assert len(upstream.requests) == 1  # no formation after a failed answer


def test_upstream_timeout_is_504(live_server, alice, upstream, llm_settings):
    llm_settings.LLM_TIMEOUT = 0.3
    llm_settings.LLM_MAX_RETRIES = 0
    upstream.push(Scripted(body=chat_body("late"), delay=1.5))
    with pytest.raises(openai.APIStatusError) as info:
        _client(live_server, alice, "u1").chat.completions.create(
            model="m", messages=[{"role": "user", "content": QUESTION}]
        )
    assert info.value.status_code == 504
    assert info.value.body["type"] == "api_error"
    assert not Fact.objects.exists()


@pytest.mark.parametrize(
    "stream, tools", [(False, False), (True, False), (False, True), (True, True)]
)
def test_a_failed_chat_makes_no_end_user(live_server, alice, upstream, llm_settings, stream, tools):
    """The end user was made before the upstream was asked: after a 502 the user's
    memories answered 200 (an empty list) where an unknown user's are a 404. With and
    without the memory tools' loop, streamed or not."""
    llm_settings.LLM_MAX_RETRIES = 0
    end_user_ensure(owner=alice, external_id="known")
    extra = {"memory_tools": True} if tools else {}
    for user in ("fails", "known"):
        upstream.push(Scripted(status=500, body={"error": {"message": "down"}}))
        with pytest.raises(openai.APIStatusError) as info:
            answer = _client(live_server, alice, user).chat.completions.create(
                model="m", messages=[{"role": "user", "content": QUESTION}], stream=stream,
                extra_body=extra,
            )  # fmt: skip
            list(answer) if stream else None
        assert info.value.status_code == 502
    # the end user seen before stays, as it was
    assert list(Scope.objects.values_list("external_id", flat=True)) == ["known"]
    key = api_key_create(owner=alice)[1]
    answer = httpx.get(f"{live_server.url}/api/v1/users/fails/memories",
                       headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip
    assert answer.status_code == 404, answer.text
    # and the next chat of theirs that is answered makes them
    _client(live_server, alice, "fails").chat.completions.create(
        model="m", messages=[{"role": "user", "content": QUESTION}]
    )
    assert Scope.objects.filter(external_id="fails").count() == 1


def test_a_streamed_chat_answered_with_json_is_a_502_and_teaches_nothing(
    live_server, alice, upstream, llm_settings
):
    """An upstream that answers ``stream: true`` with a JSON body (or a broken one): it
    was relayed as an event, 200 with an empty answer, and the turn was learned from."""
    from memories.engine.models import PendingUpdate

    upstream.push(Scripted(body='{"id": "x", "choices": ['))
    with pytest.raises(openai.APIStatusError) as info:
        list(
            _client(live_server, alice, "u1").chat.completions.create(
                model="m", messages=[{"role": "user", "content": QUESTION}], stream=True
            )
        )
    assert info.value.status_code == 502
    assert "not text/event-stream" in info.value.body["message"]
    assert not PendingUpdate.objects.exists() and not Fact.objects.exists()


def test_streaming_upstream_error_before_first_chunk_is_json_error(
    live_server, alice, upstream, llm_settings
):
    llm_settings.LLM_MAX_RETRIES = 0
    upstream.push(Scripted(status=429, body={"error": {"message": "slow"}}))
    with pytest.raises(openai.RateLimitError):
        list(
            _client(live_server, alice, "u1").chat.completions.create(
                model="m", messages=[{"role": "user", "content": QUESTION}], stream=True
            )
        )
    assert not Fact.objects.exists()
