"""What the conversations room keeps of an erased end user's chats goes with them.

The facts room erases, with an end user, the chats the chat proxy recorded for them
(``memories.facts.services.scope_erase``: the sessions of the owner's
``CHAT_PROXY_FLOW`` where they sent a message). A chat is more than its messages: its
running summary (``ConversationSummary``, keyed by flow and session) and the node
memory documents written for it (``node_memory/<flow>/<session>/``) hold what was said
too. ``sessions_erase`` deletes all three: the rows in the caller's transaction, the
documents once it commits (as ``core.erasure`` asks: a failed erasure leaves
everything)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from functools import partial

from django.db import transaction

from memories.conversations.models import Flow
from memories.conversations.node_memory.documents import _forget, _lock, _storage
from memories.conversations.node_memory.services import _listdir, _remove_empty_dirs
from memories.conversations.node_memory.values import ROOT, session_segment
from memories.conversations.services import sessions_delete_rows
from memories.conversations.summaries import sessions_summaries_delete

logger = logging.getLogger(__name__)


def sessions_erase(*, flow: Flow, session_ids: Sequence[str]) -> int:
    """Delete these sessions of ``flow``: their messages and running summaries now,
    their node memory documents once the transaction commits. Returns the messages
    deleted."""
    sessions = list(session_ids)
    # The messages first: a summary being stored holds the thread's newest message until
    # its commit (``summaries.session_still_there``), so the summaries' delete, a statement after
    # it, sees and deletes that summary too.
    deleted = sessions_delete_rows(flow=flow, session_ids=sessions)
    sessions_summaries_delete(flow=flow, session_ids=sessions)
    transaction.on_commit(
        partial(node_memory_sessions_delete, flow_id=flow.pk, session_ids=sessions)
    )
    return deleted


def node_memory_sessions_delete(*, flow_id: uuid.UUID, session_ids: Sequence[str]) -> int:
    """Delete every node memory document of these sessions of the flow, each under its
    lock (as ``node_memory_clear``), and their folders once empty. Returns the files
    deleted."""
    storage = _storage()
    deleted = 0
    for session_id in session_ids:
        directory = f"{ROOT}/{flow_id}/{session_segment(session_id)}"
        _, names = _listdir(storage, directory)
        for name in names:
            path = f"{directory}/{name}"
            with transaction.atomic():
                _lock(path.removesuffix(".gz"))
                _forget(path)
                storage.delete(path)
            deleted += 1
        _remove_empty_dirs(storage, directory)
    logger.info("erased %d node memory documents of flow %s", deleted, flow_id)
    return deleted
