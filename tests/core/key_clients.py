"""Clients for the key tests: a Bearer key's API client and its MCP calls."""

from __future__ import annotations

import json

from rest_framework.test import APIClient


def bearer_client(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def mcp_rpc(client: APIClient, method: str, params: dict | None = None) -> dict:
    """One JSON-RPC call to ``/mcp``: its answer (a result or an error)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, **({"params": params} if params else {})}
    response = client.post("/mcp", json.dumps(body), content_type="application/json",
                           HTTP_ACCEPT="application/json, text/event-stream")  # fmt: skip
    assert response.status_code == 200
    return json.loads(b"".join(response.streaming_content))
