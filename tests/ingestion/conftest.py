from __future__ import annotations

import pytest

from ingestion.services import MessageIn, flow_create, memory_base_create, messages_record


@pytest.fixture
def flow(alice):
    return flow_create(owner=alice, name="support-bot")


@pytest.fixture
def memory_base(alice, flow):
    return memory_base_create(owner=alice, name="support-memory", flow=flow, threshold=3)


def record(flow, session_id: str, *texts: str, run_id: str = "run", role: str = "assistant"):
    return messages_record(
        flow=flow,
        session_id=session_id,
        run_id=run_id,
        messages=[MessageIn(role=role, text=t) for t in texts],
    )
