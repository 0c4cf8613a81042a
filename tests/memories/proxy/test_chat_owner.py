"""A chat the proxy records (its chat id) is its end user's: another end user's turn
does not join it, through any key, so no end user writes into another's history or
takes it along when erased; a key narrowed on flows records in the proxy's flow only
when it reaches it (issue 30's review)."""

from __future__ import annotations

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from core.json_text import JsonText
from core.models import AccessEvent
from core.services import api_key_create
from memories.conversations.models import Flow, Message
from memories.conversations.services import MessageIn, flow_ensure, messages_store
from memories.proxy.chat import PreparedChat, chat_record
from tests.core.key_clients import bearer_client
from tests.fakes.openai_server import Scripted, chat_body

pytestmark = pytest.mark.django_db
CHAT = "shared-chat"
BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi there"}]}


def _client(owner, **limits) -> APIClient:
    _, raw = api_key_create(owner=owner, name="k", limits=limits or None)
    return bearer_client(raw)


def _chat(client: APIClient, user: str | None, chat: str = CHAT, **extra: str):
    headers = {"HTTP_X_OPENWEBUI_CHAT_ID": chat, **extra}
    if user is not None:
        headers["HTTP_X_OPENWEBUI_USER_ID"] = user
    return client.post("/v1/chat/completions", BODY, format="json", **headers)


def _said() -> list[tuple[str, str, str]]:
    return sorted(Message.objects.values_list("session_id", "role", "sender"))


def test_another_end_users_turn_does_not_join_a_chat(alice, llm_settings, openai_server):
    full = _client(alice)
    openai_server.push(Scripted(body=chat_body("Hello u2.")))
    assert _chat(full, "u2").status_code == 200
    before = _said()
    assert before == [(CHAT, "assistant", "assistant"), (CHAT, "user", "u2")]
    # The owner's own app (a full key): a 409 before the upstream is asked.
    refused = _chat(full, "u1")
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert error["code"] == "conflict" and CHAT in error["message"]
    # A request naming no end user is no other's turn either.
    assert _chat(full, None).status_code == 409
    # A key narrowed to u1: outside its reach, a 403.
    u1 = _client(alice, scope=["user", "u1"])
    narrowed = _chat(u1, "u1")
    assert narrowed.status_code == 403 and narrowed.json()["error"]["code"] == "key_limit"
    assert len(openai_server.requests) == 1 and _said() == before
    # The chat's own end user goes on; u1 has a chat of its own.
    openai_server.push(Scripted(body=chat_body("Again.")), Scripted(body=chat_body("Hi u1.")))
    assert _chat(full, "u2").status_code == 200
    assert _chat(u1, "u1", chat="chat-of-u1").status_code == 200
    # Erasing u1 (with its own key) leaves u2's chat whole.
    erased = u1.delete("/api/v1/users/u1/memories")
    assert erased.status_code == 200, erased.content
    assert AccessEvent.objects.get(action="erasure").detail["counts"]["chats"] == 1
    assert [s for s, role, _ in _said() if role == "user"] == [CHAT, CHAT]
    assert Message.objects.filter(session_id=CHAT).count() == 4


def test_the_turn_that_lost_the_race_is_not_recorded(alice):
    """Two end users' first turns of one new chat, both let through before either was
    recorded: the one recorded second is dropped (the answer went out already)."""
    flow = flow_ensure(owner_id=alice.pk, name=settings.CHAT_PROXY_FLOW)
    messages_store(flow=flow, session_id=CHAT, run_id="r",
                   messages=[MessageIn(role="user", text="first", sender="u2")])  # fmt: skip
    late = PreparedChat(request=JsonText.of(BODY), owner_id=alice.pk, chat_id=CHAT,
                        chat_sender="u1", user_text="second")  # fmt: skip
    chat_record(late, "an answer")
    assert _said() == [(CHAT, "user", "u2")]
    # The chat's own end user is recorded.
    own = PreparedChat(request=JsonText.of(BODY), owner_id=alice.pk, chat_id=CHAT,
                       chat_sender="u2", user_text="third")  # fmt: skip
    chat_record(own, "another answer")
    assert _said() == [(CHAT, "assistant", "assistant"), (CHAT, "user", "u2"), (CHAT, "user", "u2")]


def test_a_turn_whose_end_user_was_erased_while_it_streamed_is_dropped(alice):
    """An end user erased while their answer streamed: the turn was recorded when it
    ended, and the learning queued, which brought the end user back."""
    from ingestion.tasks import form_memories
    from memories.engine.models import PendingUpdate
    from memories.facts.models import Scope
    from memories.facts.scopes import end_user_ensure
    from memories.facts.services import scope_erase

    scope = end_user_ensure(owner=alice, external_id="xena")
    turn = PreparedChat(request=JsonText.of(BODY), owner_id=alice.pk, chat_id="xena-1",
                        chat_sender="xena", user_text="I own a red bicycle", end_user=scope,
                        formation_pending=True)  # fmt: skip
    scope_id = scope.pk
    scope_erase(scope=Scope.objects.get(pk=scope_id))
    chat_record(turn, "Nice bicycle.")
    assert _said() == [] and turn.formation_pending is False
    # a learning queued before the erasure (a chat without a chat id) learns nothing
    assert form_memories(alice.pk, "xena", "I own a red bicycle", "2026-11-28T10:00:00+00:00",
                         "", scope_id) == 0  # fmt: skip
    assert not Scope.objects.exists() and not PendingUpdate.objects.exists()
    # an end user still there: recorded and learned as before
    kept = end_user_ensure(owner=alice, external_id="yuri")
    turn = PreparedChat(request=JsonText.of(BODY), owner_id=alice.pk, chat_id="yuri-1",
                        chat_sender="yuri", user_text="I own a red bicycle", end_user=kept)  # fmt: skip
    chat_record(turn, "Nice bicycle.")
    assert _said() == [("yuri-1", "assistant", "assistant"), ("yuri-1", "user", "yuri")]
    assert form_memories(alice.pk, "yuri", "I own a red bicycle", "2026-11-28T10:00:00+00:00",
                         "", kept.pk) > 0  # fmt: skip


def test_a_key_narrowed_on_flows_records_only_in_a_flow_it_reaches(
    alice, llm_settings, openai_server
):
    from memories.conversations.services import flow_create

    mine = flow_create(owner=alice, name="mine")
    key = _client(alice, flows=[str(mine.pk)])
    # No proxy flow yet: the key may not create one.
    refused = _chat(key, "u1", chat="c1")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "key_limit"
    assert list(Flow.objects.values_list("name", flat=True)) == ["mine"]
    assert not Message.objects.exists() and openai_server.requests == []
    # There, but not among its flows: still a 403, nothing recorded.
    openai_server.push(Scripted(body=chat_body("Hello.")))
    assert _chat(_client(alice), "u2", chat="c2").status_code == 200
    proxy_flow = Flow.objects.get(name=settings.CHAT_PROXY_FLOW)
    before = _said()
    assert _chat(key, "u1", chat="c1").status_code == 403
    assert _said() == before and len(openai_server.requests) == 1
    # Without a chat id nothing is recorded, and the chat goes through.
    openai_server.push(Scripted(body=chat_body("Hi.")))
    plain = key.post("/v1/chat/completions", BODY, format="json", HTTP_X_OPENWEBUI_USER_ID="u1")
    assert plain.status_code == 200 and _said() == before
    # A key that reaches the proxy's flow records there.
    reaching = _client(alice, flows=[str(mine.pk), str(proxy_flow.pk)])
    openai_server.push(Scripted(body=chat_body("Recorded.")))
    assert _chat(reaching, "u1", chat="c1").status_code == 200
    assert ("c1", "user", "u1") in _said()


def test_a_key_for_one_end_user_records_its_chats_whatever_its_flows(
    alice, llm_settings, openai_server
):
    """The documented one-end-user key (no flows) keeps its chats: they are its end
    user's, recorded and erased with them."""
    key = _client(alice, scope=["user", "u1"], flows=[], knowledge_bases=[], memory_bases=[],
                  memory_stores=[])  # fmt: skip
    openai_server.push(Scripted(body=chat_body("Hello u1.")))
    assert _chat(key, "u1", chat="c1").status_code == 200
    assert _said() == [("c1", "assistant", "assistant"), ("c1", "user", "u1")]
    assert Flow.objects.get().name == settings.CHAT_PROXY_FLOW
    # It reads the flow through no other door.
    refused = key.get(f"/api/v1/flows/{Flow.objects.get().pk}")
    assert refused.status_code == 403


def test_an_upstream_failure_mid_stream_is_an_event_in_openais_error_shape():
    """A new user's audit: the event said type upstream_error and an integer code, where
    the same failure before the stream began answers type api_error, a string code and
    param (OpenAI's shape, and the schema's)."""
    import json

    from core.providers.errors import ProviderError
    from memories.proxy.chat import error_event

    raw = error_event(ProviderError("provider unreachable: connection reset"))
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    assert json.loads(raw[6:]) == {"error": {
        "message": "provider unreachable: connection reset", "type": "api_error",
        "param": None, "code": "upstream_error", "details": None,
    }}  # fmt: skip


@pytest.mark.django_db(transaction=True)  # (closing a response closes its connection)
def test_a_stream_the_client_leaves_still_counts_its_usage(alice, llm_settings, openai_server):
    """A new user's audit, under ``manage.py serve``: a client that went away mid-stream
    closed the response, the stream counted the upstream call while closing, as nobody
    (Django runs the body's closer after the middleware returned), and row-level
    security refused the write: ``usage not recorded``. The closer now runs as the
    request's owner."""
    from core import tenancy
    from core.models import UsageDay

    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
              for w in ("Hello", " there", " again")]  # fmt: skip
    openai_server.push(Scripted(stream_chunks=chunks))
    client = _client(alice)
    with tenancy.running_as(tenancy.NOBODY):  # (as a server's thread: no owner of its own)
        response = client.post("/v1/chat/completions", {**BODY, "stream": True}, format="json",
                               HTTP_X_OPENWEBUI_USER_ID="u1")  # fmt: skip
        assert response.status_code == 200
        next(iter(response.streaming_content))  # the client reads one event, then leaves
        response.close()  # (what a server does then: the response's closers)
    assert list(UsageDay.objects.filter(owner=alice).values_list("kind", "calls")) == [("proxy", 1)]
