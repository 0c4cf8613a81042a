"""Capture: store a flow run's messages and trigger Memory Base ingestion where a
session reaches its threshold."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

from django.db import transaction

from core.queue import after_commit
from memories.bases.services import session_ingest_enqueue_quietly, sessions_due
from memories.conversations.models import Flow, Message
from memories.conversations.services import MessageIn, messages_store

logger = logging.getLogger(__name__)


def messages_record(
    *, flow: Flow, session_id: str, run_id: str, messages: Sequence[MessageIn]
) -> list[Message]:
    """Store one run's messages and trigger ingestion where a threshold is reached.

    The messages are committed whatever happens to the trigger: for each
    auto-capture memory base of the flow the session row is ensured and, if the
    pending outputs reach the threshold, a job is queued after the commit; a
    failure to queue is logged and retried at the next trigger.
    """
    with transaction.atomic():
        stored = messages_store(flow=flow, session_id=session_id, run_id=run_id, messages=messages)
        for session in sessions_due(flow=flow, session_id=session_id):
            after_commit(partial(session_ingest_enqueue_quietly, session=session))
    return stored
