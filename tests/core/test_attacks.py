"""The attacker's fault sections against a real served instance (the shared one,
tests/served.py: gunicorn and the worker, its own embedded PostgreSQL): hostile input
never answers 5xx or HTML and writes nothing; one owner can neither see nor change
another's objects, over the API, the tools endpoint and MCP (``scripts/faults/tenancy.py``).
Both compare every row of every project table before and after, once the background work
queued before them is done (``settled_digest``)."""

from __future__ import annotations

import pytest

from scripts.faults.attacks import hostile_input
from scripts.faults.tenancy import cross_tenant

pytestmark = pytest.mark.slow


def test_hostile_input(shared_served):
    figures = hostile_input(shared_served)
    assert figures["requests"] >= 100
    assert figures["server_errors_5xx"] == 0
    assert figures["bad"] == []
    assert figures["requests_that_wrote"] == []
    assert figures["tables_changed"] == []


def test_cross_tenant_sweep(shared_served):
    figures = cross_tenant(shared_served)
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
