"""Keys narrowed when created (issue 30, item 2, the read-only and expiring part): a
read-only key reads and searches through every door and changes nothing (a 403
``read_only_key``, nothing written); an expired key is a 401; ``GET /api/v1/me`` shows
the key's limits; bad limits are a 400 naming the field, nothing created."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from core.models import APIKey, UsageBudget
from core.services import api_key_create
from knowledge.models import KnowledgeBase
from knowledge.services.bases import knowledge_base_create
from memories.facts.models import Fact
from memories.facts.scopes import end_user_ensure
from memories.facts.services import FactIn, fact_add
from tests.core.key_clients import bearer_client as _client
from tests.core.key_clients import mcp_rpc as _rpc

pytestmark = pytest.mark.django_db
SCOPE = ["user", "u1"]


@pytest.fixture
def reader(alice):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    fact_add(owner=alice, scope=end_user, facts=[FactIn("User lives in Lisbon")], reason="seed")
    knowledge_base_create(owner=alice, name="docs")
    _, raw = api_key_create(owner=alice, name="extension", read_only=True)
    return _client(raw)


def _refused(response, status: int = 403) -> None:
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == "read_only_key"


def test_a_read_only_key_reads_and_searches_over_rest(alice, reader):
    kb = KnowledgeBase.objects.get(owner=alice, name="docs")
    assert reader.get("/api/v1/knowledge-bases").status_code == 200
    assert reader.get("/api/v1/users/u1/memories").status_code == 200
    reads = [
        (f"/api/v1/knowledge-bases/{kb.pk}/search", {"query": "Lisbon"}),
        ("/api/v1/search", {"query": "Lisbon", "knowledge_base_ids": [str(kb.pk)]}),
        ("/api/v1/users/u1/memories/search", {"query": "Lisbon"}),
        ("/api/v1/engine/search", {"scope": SCOPE, "query": "Lisbon"}),
        ("/api/v1/engine/injection", {"scope": SCOPE, "query": "Lisbon", "max_tokens": 200}),
    ]
    for path, body in reads:
        assert reader.post(path, body, format="json").status_code == 200, path
    found = reader.post("/api/v1/engine/search", {"scope": SCOPE, "query": "Lisbon"}, format="json")
    assert [h["content"] for h in found.json()["results"]] == ["User lives in Lisbon"]


def test_a_read_only_key_changes_nothing_over_rest(alice, reader):
    before = (Fact.objects.count(), KnowledgeBase.objects.count(), APIKey.objects.count())
    _refused(reader.post("/api/v1/knowledge-bases", {"name": "more"}, format="json"))
    _refused(reader.post("/api/v1/engine/facts", {"scope": SCOPE, "content": "x"}, format="json"))
    _refused(reader.delete("/api/v1/users/u1/memories"))
    _refused(reader.post("/api/v1/engine/erase", {"scope": SCOPE}, format="json"))
    _refused(reader.post("/api/v1/api-keys", {"name": "wider"}, format="json"))
    _refused(reader.patch("/api/v1/me", {"background_daily_tokens": 5}, format="json"))
    assert (Fact.objects.count(), KnowledgeBase.objects.count(), APIKey.objects.count()) == before
    assert not UsageBudget.objects.filter(owner=alice).exists()
    me = reader.get("/api/v1/me").json()
    key = APIKey.objects.get(name="extension")
    no_limits = dict.fromkeys(
        ["knowledge_bases", "memory_bases", "flows", "memory_stores", "scope", "tools"]
    )
    assert me["key"] == {"id": key.pk, "prefix": key.prefix, "read_only": True, "expires_at": None,
                         "limits": no_limits}  # fmt: skip


def test_a_read_only_key_through_the_tools_and_the_proxy(
    alice, reader, llm_settings, openai_server
):
    listed = [t["function"]["name"] for t in reader.get("/api/v1/tools").json()["tools"]]
    assert sorted(listed) == ["retrieve_node_memory", "search_memory"]
    found = reader.post("/api/v1/tools/search_memory/call",
                        {"scope": SCOPE, "arguments": {"query": "Lisbon"}}, format="json")  # fmt: skip
    assert found.status_code == 200
    assert [h["content"] for h in found.json()["result"]["results"]] == ["User lives in Lisbon"]
    before = Fact.objects.count()
    refused = reader.post("/api/v1/tools/manage_memory/call",
                          {"scope": SCOPE, "arguments": {"content": "User likes tea"}},
                          format="json")  # fmt: skip
    _refused(refused)
    assert "search_memory" in refused.json()["error"]["message"]
    # The chat proxy is refused (its answers would teach the end user's memory), in the
    # OpenAI error shape; the upstream is never called.
    chat = reader.post("/v1/chat/completions",
                       {"model": "m", "messages": [{"role": "user", "content": "I like tea"}]},
                       format="json", HTTP_X_OPENWEBUI_USER_ID="u1")  # fmt: skip
    assert chat.status_code == 403
    assert chat.json()["error"]["code"] == "read_only_key" and openai_server.requests == []
    assert Fact.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_a_read_only_key_over_mcp_lists_and_runs_only_the_tools_that_read(alice):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    fact_add(owner=alice, scope=end_user, facts=[FactIn("User lives in Lisbon")], reason="seed")
    _, raw = api_key_create(owner=alice, read_only=True)
    reader = _client(raw)
    listed = [t["name"] for t in _rpc(reader, "tools/list")["result"]["tools"]]
    assert sorted(listed) == ["retrieve_node_memory", "search_memory"]
    found = _rpc(reader, "tools/call", {"name": "search_memory",
                                        "arguments": {"scope": SCOPE, "query": "Lisbon"}})  # fmt: skip
    assert found["result"]["structuredContent"]["results"][0]["content"] == "User lives in Lisbon"
    refused = _rpc(reader, "tools/call", {"name": "manage_memory",
                                          "arguments": {"scope": SCOPE, "content": "User likes tea"}})  # fmt: skip
    assert refused["result"]["isError"] is True
    assert "read-only" in refused["result"]["content"][0]["text"]
    assert Fact.objects.count() == 1
    _, full = api_key_create(owner=alice)
    assert "manage_memory" in [
        t["name"] for t in _rpc(_client(full), "tools/list")["result"]["tools"]
    ]


def test_an_expired_key_is_refused(alice, alice_client):
    soon = timezone.now() + timedelta(hours=1)
    created = alice_client.post("/api/v1/api-keys", {"name": "day pass", "expires_at": soon.isoformat()},
                                format="json")  # fmt: skip
    assert created.status_code == 201
    body = created.json()
    assert body["read_only"] is False and body["expires_at"] is not None and body["is_active"]
    temporary = _client(body["key"])
    assert temporary.get("/api/v1/me").json()["key"]["expires_at"] is not None
    APIKey.objects.filter(pk=body["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused = temporary.get("/api/v1/me")
    assert refused.status_code == 401
    assert refused.json()["error"]["message"] == "Invalid, expired or revoked API key."
    assert alice_client.get(f"/api/v1/api-keys/{body['id']}").json()["is_active"] is False


@pytest.mark.parametrize(
    "body, field",
    [
        ({"expires_at": "2020-01-01T00:00:00Z"}, "expires_at"),
        ({"expires_at": "tomorrow"}, "expires_at"),
        ({"read_only": "yes please"}, "read_only"),
    ],
)
def test_bad_limits_are_refused_and_create_nothing(alice, alice_client, body, field):
    before = APIKey.objects.count()
    response = alice_client.post("/api/v1/api-keys", {"name": "x", **body}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert field in json.dumps(error)
    assert APIKey.objects.count() == before


def test_the_command_narrows_a_key(alice):
    out = StringIO()
    call_command("create_api_key", "alice", "--read-only", "--expires-at", "2999-01-01T00:00:00Z",
                 stdout=out)  # fmt: skip
    key = APIKey.objects.filter(owner=alice).latest("id")
    assert key.read_only and key.expires_at.year == 2999
    before = APIKey.objects.count()
    for bad in ("2001-01-01T00:00:00Z", "soon", "2999-01-01T00:00:00"):
        with pytest.raises(CommandError):
            call_command("create_api_key", "alice", "--expires-at", bad, stdout=StringIO())
    assert APIKey.objects.count() == before
