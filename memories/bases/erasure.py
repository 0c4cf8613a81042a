"""What the memory bases keep of an erased end user goes with them (``core.erasure``).

The facts room erases the chats the chat proxy recorded for an end user (the
sessions of the owner's ``CHAT_PROXY_FLOW`` where the user sent a message), but it
cannot import this room; a memory base attached to that flow keeps chunks of those
chats. This receiver purges them, with the sessions' jobs, inside the erasure's
transaction (``session_chunks_delete``); the messages stay for the facts room, which
erases the chats after the receivers (the other receivers find the chats by them)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from memories.bases.models import MemoryBase
from memories.bases.services import session_chunks_delete
from memories.conversations.selectors import flow_find, session_ids_with_sender


def scope_erase_memory_base_chats(*, owner_id: int, scope: list[str], **_: Any) -> None:
    """Receiver of ``scope_erased``: for an end user's scope ``["user", <id>]``, purge
    the memory bases' chunks of the chats recorded for that user."""
    if len(scope) != 2 or scope[0] != "user" or not scope[1]:
        return
    flow = flow_find(owner_id=owner_id, name=settings.CHAT_PROXY_FLOW)
    if flow is None or not MemoryBase.objects.filter(flow=flow).exists():
        return
    for session_id in session_ids_with_sender(flow=flow, sender=scope[1][:100]):
        session_chunks_delete(flow=flow, session_id=session_id)
