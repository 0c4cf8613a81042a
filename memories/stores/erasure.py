"""What the memory stores keep of an erased end user goes with them (``core.erasure``).

The facts room erases the chats the chat proxy recorded for an end user (the sessions
of the owner's ``CHAT_PROXY_FLOW`` where the user sent a message), but it cannot import
this room; the turns a node of a flow wrote to its stores for one of those chats (with
its session id) hold what was said. This receiver deletes those items inside the
erasure's transaction, before the facts room deletes the chats' messages."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from memories.conversations.selectors import flow_find, session_ids_with_sender
from memories.stores.services import session_items_delete


def scope_erase_store_items(*, owner_id: int, scope: list[str], **_: Any) -> None:
    """Receiver of ``scope_erased``: for an end user's scope ``["user", <id>]``, delete
    the owner's store items written for the chats recorded for that user."""
    if len(scope) != 2 or scope[0] != "user" or not scope[1]:
        return
    flow = flow_find(owner_id=owner_id, name=settings.CHAT_PROXY_FLOW)
    if flow is None:
        return
    chats = session_ids_with_sender(flow=flow, sender=scope[1][:100])
    if chats:
        session_items_delete(owner_id=owner_id, session_ids=chats)
