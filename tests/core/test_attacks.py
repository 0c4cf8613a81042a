"""The attacker's fault sections against a real served instance (gunicorn, its own
embedded PostgreSQL): hostile input never answers 5xx or HTML and writes nothing; one
owner can neither see nor change another's objects, over the API, the tools endpoint
and MCP (``scripts/faults/tenancy.py``)."""

from __future__ import annotations

import pytest
from django.conf import settings

from scripts.faults.attacks import hostile_input
from scripts.faults.harness import Instance
from scripts.faults.tenancy import cross_tenant

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served():
    if not settings.EMBEDDED_DATABASE:
        pytest.skip("runs an instance on its own embedded server")
    inst = Instance()
    inst.start("serve", "--web-workers", "1", "--no-worker")
    inst.wait_healthy(worker=False)
    yield inst
    inst.destroy()


def test_hostile_input(served):
    figures = hostile_input(served)
    assert figures["requests"] >= 100
    assert figures["server_errors_5xx"] == 0
    assert figures["bad"] == []
    assert figures["requests_that_wrote"] == []
    assert figures["tables_changed"] == []


def test_cross_tenant_sweep(served):
    figures = cross_tenant(served)
    assert figures["requests"] >= 143  # the attack sent 143
    assert set(figures["by_family"]) == {
        "memory bases and sessions",
        "knowledge bases, documents, search",
        "jobs",
        "flows, runs, messages, conversations",
        "users' memories",
        "memory stores, items, config, node memory",
        "engine",
        "tools call",
        "API keys",
        "MCP (/mcp)",
        "lists",
    }
    assert figures["wrong"] == []
    assert figures["tables_changed"] == []
