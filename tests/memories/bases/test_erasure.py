"""Erasing an end user purges the chunks a memory base made of the chats the chat proxy
recorded for them (the personal room erases the chats; the bases room, which it cannot
import, purges its chunks through ``core.erasure.scope_erased``)."""

from __future__ import annotations

import pytest
from django.db import transaction

from knowledge.models import Chunk
from memories.bases.models import MemoryBaseSession
from memories.bases.services import memory_base_create, messages_record
from memories.conversations.models import Message
from memories.conversations.services import MessageIn, flow_create
from memories.facts.scopes import end_user_ensure
from memories.facts.services import scope_erase

pytestmark = pytest.mark.django_db(transaction=True)


def _chat(flow, user: str, chat: str) -> None:
    messages_record(
        flow=flow, session_id=chat, run_id="r1",
        messages=[MessageIn(role="user", text=f"{user} says hi", sender=user),
                  MessageIn(role="assistant", text=f"hello {user}"),
                  MessageIn(role="assistant", text=f"more for {user}"),
                  MessageIn(role="assistant", text=f"last for {user}")],
    )  # fmt: skip


def _sessions(model) -> list[str]:
    return sorted(set(model.objects.values_list("session_id", flat=True)))


def test_erasing_a_user_purges_the_memory_base_chunks_of_their_chats(alice, bob, settings):
    flow = flow_create(owner=alice, name=settings.CHAT_PROXY_FLOW)
    memory_base_create(owner=alice, name="chats", flow=flow, threshold=3)
    bobs_flow = flow_create(owner=bob, name=settings.CHAT_PROXY_FLOW)
    memory_base_create(owner=bob, name="chats", flow=bobs_flow, threshold=3)
    _chat(flow, "u1", "chat-of-u1")
    _chat(flow, "u2", "chat-of-u2")
    _chat(bobs_flow, "u1", "bobs-chat-of-u1")  # bob's end user u1 is another person
    assert _sessions(Chunk) == ["bobs-chat-of-u1", "chat-of-u1", "chat-of-u2"]

    scope_erase(scope=end_user_ensure(owner=alice, external_id="u1"))

    assert _sessions(Chunk) == ["bobs-chat-of-u1", "chat-of-u2"]
    assert _sessions(Message) == ["bobs-chat-of-u1", "chat-of-u2"]
    assert _sessions(MemoryBaseSession) == ["bobs-chat-of-u1", "chat-of-u2"]


def test_a_rolled_back_erasure_keeps_the_chunks(alice, settings):
    flow = flow_create(owner=alice, name=settings.CHAT_PROXY_FLOW)
    memory_base_create(owner=alice, name="chats", flow=flow, threshold=3)
    _chat(flow, "u1", "chat-of-u1")
    chunks = sorted(Chunk.objects.values_list("pk", flat=True))
    user = end_user_ensure(owner=alice, external_id="u1")
    with pytest.raises(RuntimeError), transaction.atomic():
        scope_erase(scope=user)
        raise RuntimeError("the caller fails after the erasure")
    assert sorted(Chunk.objects.values_list("pk", flat=True)) == chunks
    assert _sessions(Message) == ["chat-of-u1"]
