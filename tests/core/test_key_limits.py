"""Keys narrowed to named resources, a scope and tools (issue 30, item 2): through every
door (REST, the tools endpoint, MCP, the chat proxy) a narrowed key reaching outside its
limits gets a 403 ``key_limit`` and changes nothing; lists show only what it may reach;
another owner's object stays a 404; bad limits are a 400 naming the field, nothing
created; ``GET /api/v1/me``, the command, the admin and the audit trail show them."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from core.models import AccessEvent, APIKey, UsageBudget
from core.services import api_key_create
from knowledge.models import IngestJob, KnowledgeBase
from knowledge.services.bases import knowledge_base_create
from memories.bases.models import MemoryBase
from memories.bases.services import memory_base_create
from memories.conversations.models import Flow, Message
from memories.conversations.services import flow_create
from memories.facts.models import Fact, Scope
from memories.facts.scopes import end_user_ensure, global_scope_ensure
from memories.facts.services import FactIn, fact_add
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.services import memory_store_create
from tests.conftest import record
from tests.core.key_clients import bearer_client as _client
from tests.core.key_clients import mcp_rpc as _rpc
from tests.fakes.openai_server import Scripted, chat_body
from tests.knowledge.factories import ingest

pytestmark = pytest.mark.django_db
U1, U2 = ["user", "u1"], ["user", "u2"]


def _narrowed(owner, **limits) -> APIClient:
    _, raw = api_key_create(owner=owner, name="narrowed", limits=limits)
    return _client(raw)


def _refused(response, status: int = 403) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == "key_limit", error
    return error


def _names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return sorted(r["name"] for r in response.json()["results"])


# --- creating a narrowed key --------------------------------------------------------


def test_a_key_is_narrowed_through_the_api_and_me_shows_it(alice, alice_client):
    kb = knowledge_base_create(owner=alice, name="docs")
    body = {
        "name": "extension",
        "limits": {"knowledge_bases": [str(kb.pk)], "scope": U1, "tools": ["search_memory"],
                   "flows": []},
    }  # fmt: skip
    created = alice_client.post("/api/v1/api-keys", body, format="json")
    assert created.status_code == 201, created.content
    limits = {
        "knowledge_bases": [str(kb.pk)], "memory_bases": None, "flows": [],
        "memory_stores": None, "scope": U1, "tools": ["search_memory"],
    }  # fmt: skip
    assert created.json()["limits"] == limits
    key = APIKey.objects.get(pk=created.json()["id"])
    assert (key.knowledge_bases, key.scope, key.tools, key.flows) == (
        [kb.pk], U1, ["search_memory"], [],
    )  # fmt: skip
    me = _client(created.json()["key"]).get("/api/v1/me").json()
    assert me["key"]["limits"] == limits
    listed = alice_client.get(f"/api/v1/api-keys/{key.pk}").json()
    assert listed["limits"] == limits
    # The narrowing is in the audit trail, without the end user's id.
    narrowed = AccessEvent.objects.get(action="key_narrowed", subject_key=key)
    assert narrowed.detail == {"knowledge_bases": [str(kb.pk)], "flows": [],
                               "tools": ["search_memory"], "scope_segments": 2}  # fmt: skip
    assert "u1" not in json.dumps(narrowed.detail)
    # A key made before limits existed, or without them, is a full key.
    assert alice_client.get("/api/v1/me").json()["key"]["limits"] == dict.fromkeys(limits)


@pytest.mark.parametrize(
    "limits, field",
    [
        ({"colour": ["red"]}, "limits.colour"),
        ({"scope": "user/u1"}, "limits.scope"),
        ({"scope": ["user", 3]}, "limits.scope"),
        ({"scope": []}, "limits.scope"),
        ({"scope": ["user", "bad id"]}, "limits.scope"),
        ({"knowledge_bases": ["not-an-id"]}, "limits.knowledge_bases"),
        ({"knowledge_bases": "BOBS"}, "limits.knowledge_bases"),
        ({"knowledge_bases": ["BOBS"]}, "limits.knowledge_bases"),
        ({"memory_stores": ["00000000-0000-0000-0000-000000000001"]}, "limits.memory_stores"),
        ({"tools": ["rm_rf"]}, "limits.tools"),
        ("everything", "limits"),
    ],
)
def test_bad_limits_are_a_400_naming_the_field_and_create_nothing(
    alice, bob, alice_client, limits, field
):
    bobs = str(knowledge_base_create(owner=bob, name="bob's").pk)
    if isinstance(limits, dict):
        limits = {k: (bobs if v == "BOBS" else [bobs if x == "BOBS" else x for x in v])
                  if isinstance(v, list | str) and "BOBS" in v else v
                  for k, v in limits.items()}  # fmt: skip
    before = (APIKey.objects.count(), AccessEvent.objects.count())
    response = alice_client.post("/api/v1/api-keys", {"name": "x", "limits": limits},
                                 format="json")  # fmt: skip
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"], response.json()
    assert (APIKey.objects.count(), AccessEvent.objects.count()) == before


def test_an_expiry_in_the_past_with_limits_creates_nothing(alice, alice_client):
    before = APIKey.objects.count()
    response = alice_client.post(
        "/api/v1/api-keys",
        {"expires_at": "2020-01-01T00:00:00Z", "limits": {"scope": U1}}, format="json",
    )  # fmt: skip
    assert response.status_code == 400
    assert "expires_at" in response.json()["error"]["details"]
    assert APIKey.objects.count() == before


def test_the_command_narrows_a_key(alice, bob):
    kb = knowledge_base_create(owner=alice, name="docs")
    out = StringIO()
    call_command("create_api_key", "alice", "--knowledge-base", str(kb.pk), "--scope",
                 '["user", "u1"]', "--tool", "search_memory", stdout=out)  # fmt: skip
    key = APIKey.objects.filter(owner=alice).latest("id")
    assert (key.knowledge_bases, key.scope, key.tools, key.flows) == (
        [kb.pk], U1, ["search_memory"], None,
    )  # fmt: skip
    assert out.getvalue().splitlines()[-1].startswith("mem_")
    bobs = knowledge_base_create(owner=bob, name="bob's")
    before = APIKey.objects.count()
    bad = [
        ["--knowledge-base", str(bobs.pk)],
        ["--tool", "rm_rf"],
        ["--scope", "user/u1"],
        ["--scope", '"user"'],
        ["--flow", "nope"],
    ]
    for args in bad:  # (the error names the option as the command spells it)
        with pytest.raises(CommandError, match=args[0]):
            call_command("create_api_key", "alice", *args, stdout=StringIO())
    assert APIKey.objects.count() == before


def test_the_admin_creates_lists_and_revokes_narrowed_keys(alice, bob, admin_client):
    kb = knowledge_base_create(owner=alice, name="docs")
    bobs = knowledge_base_create(owner=bob, name="bob's")
    form = {"owner": alice.pk, "name": "app", "knowledge_bases": str(kb.pk),
            "scope": "user,u1", "tools": "search_memory"}  # fmt: skip
    refused = admin_client.post(
        "/admin/core/apikey/add/", {**form, "knowledge_bases": str(bobs.pk)}
    )
    assert refused.status_code == 200 and "not your knowledge bases" in refused.content.decode()
    assert not APIKey.objects.filter(name="app").exists()
    assert admin_client.post("/admin/core/apikey/add/", form).status_code == 302
    key = APIKey.objects.get(name="app")
    assert (key.knowledge_bases, key.scope, key.tools, key.memory_bases) == (
        [kb.pk], U1, ["search_memory"], None,
    )  # fmt: skip
    assert AccessEvent.objects.filter(action="key_narrowed", subject_key=key).count() == 1
    page = admin_client.get("/admin/core/apikey/").content.decode()
    assert "1 knowledge bases; scope user/u1; tools: search_memory" in page
    revoked = admin_client.post("/admin/core/apikey/", {
        "action": "revoke_keys", "_selected_action": [key.pk], "confirmed": "yes",
    })  # fmt: skip
    assert revoked.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


# --- knowledge bases, memory bases, flows, memory stores (REST and the tools) ---------


def test_a_key_narrowed_to_knowledge_bases(alice, bob, alice_client):
    mine = knowledge_base_create(owner=alice, name="mine")
    other = knowledge_base_create(owner=alice, name="other")
    bobs = knowledge_base_create(owner=bob, name="bob's")
    key = _narrowed(alice, knowledge_bases=[str(mine.pk)])
    assert _names(key.get("/api/v1/knowledge-bases")) == ["mine"]
    assert _names(alice_client.get("/api/v1/knowledge-bases")) == ["mine", "other"]
    url = f"/api/v1/knowledge-bases/{other.pk}"
    assert key.get(f"/api/v1/knowledge-bases/{mine.pk}").status_code == 200
    assert key.get(f"/api/v1/knowledge-bases/{bobs.pk}").status_code == 404  # another tenant
    _refused(key.get(url))
    _refused(key.patch(url, {"name": "renamed"}, format="json"))
    _refused(key.delete(url))
    _refused(key.get(f"{url}/chunks"))
    _refused(key.post(f"{url}/documents", {"documents": [{"text": "x"}]}, format="json"))
    _refused(key.post(f"{url}/search", {"query": "x"}, format="json"))
    _refused(key.post("/api/v1/search", {"query": "x", "knowledge_base_ids": [str(other.pk)]},
                      format="json"))  # fmt: skip
    _refused(key.post("/api/v1/knowledge-bases", {"name": "new"}, format="json"))
    assert key.post("/api/v1/search", {"query": "x"}, format="json").status_code == 200
    other.refresh_from_db()
    assert other.name == "other"
    assert KnowledgeBase.objects.filter(owner=alice).count() == 2
    assert not IngestJob.objects.exists()


def test_a_key_narrowed_to_memory_bases(alice, alice_client):
    flow = flow_create(owner=alice, name="bot")
    mine = memory_base_create(owner=alice, name="mine", flow=flow)
    other = memory_base_create(owner=alice, name="other", flow=flow, threshold=7)
    key = _narrowed(alice, memory_bases=[str(mine.pk)])
    assert _names(key.get("/api/v1/memory-bases")) == ["mine"]
    assert _names(alice_client.get("/api/v1/memory-bases")) == ["mine", "other"]
    url = f"/api/v1/memory-bases/{other.pk}"
    assert key.get(f"/api/v1/memory-bases/{mine.pk}").status_code == 200
    _refused(key.get(url))
    _refused(key.patch(url, {"threshold": 3}, format="json"))
    _refused(key.delete(url))
    _refused(key.get(f"{url}/sessions"))
    _refused(key.post(f"{url}/flush", {}, format="json"))
    _refused(key.post(f"/api/v1/memories/{other.pk}/regenerate", {}, format="json"))
    _refused(key.get("/api/v1/messages", {"memory_base_id": str(other.pk)}))
    _refused(key.post("/api/v1/memory-bases", {"name": "new", "flow": str(flow.pk)},
                      format="json"))  # fmt: skip
    other.refresh_from_db()
    assert other.threshold == 7 and MemoryBase.objects.filter(owner=alice).count() == 2
    assert not other.jobs.exists()


def test_a_key_narrowed_to_flows(alice, alice_client):
    mine = flow_create(owner=alice, name="mine")
    other = flow_create(owner=alice, name="other")
    record(mine, "s1", "mine says")
    record(other, "s1", "other says")
    key = _narrowed(alice, flows=[str(mine.pk)])
    assert _names(key.get("/api/v1/flows")) == ["mine"]
    assert _names(alice_client.get("/api/v1/flows")) == ["mine", "other"]
    listed = key.get("/api/v1/messages").json()["results"]
    assert [m["text"] for m in listed] == ["mine says"]
    before = Message.objects.count()
    _refused(key.get(f"/api/v1/flows/{other.pk}"))
    _refused(key.get("/api/v1/messages", {"flow": str(other.pk)}))
    _refused(key.post("/api/v1/messages", {"flow": str(other.pk), "session_id": "s2",
                                           "role": "user", "content": "hi"}, format="json"))  # fmt: skip
    _refused(key.delete(f"/api/v1/flows/{other.pk}/sessions/s1/messages"))
    _refused(key.get("/api/v1/conversations/s1/history", {"flow": str(other.pk)}))
    _refused(key.post(f"/api/v1/flows/{other.pk}/nodes/answer/memory/retrieve",
                      {"stage": "pre", "query": "x"}, format="json"))  # fmt: skip
    _refused(key.post("/api/v1/flows", {"name": "new"}, format="json"))
    # The tools door: the node memory tools name a flow.
    called = key.post("/api/v1/tools/write_node_memory/call", {"arguments": {
        "flow": str(other.pk), "node_id": "answer", "input": "q", "output": "a"}}, format="json")  # fmt: skip
    _refused(called)
    assert Message.objects.count() == before and Flow.objects.filter(owner=alice).count() == 2


def test_a_memory_bases_knowledge_base_is_the_memory_bases(alice, alice_client):
    """A memory base (and a file store) keeps its content in a knowledge base of its
    own: a key narrowed on memory bases (stores) reaches that base only with its holder,
    whatever its knowledge_bases."""
    flow = flow_create(owner=alice, name="bot")
    mine = memory_base_create(owner=alice, name="mine", flow=flow)
    other = memory_base_create(owner=alice, name="other", flow=flow)
    docs = knowledge_base_create(owner=alice, name="docs")
    files = knowledge_base_create(owner=alice, name="files of a store")
    store = MemoryStore.objects.create(owner=alice, name="docs_store", type="file",
                                       knowledge_base=files)  # fmt: skip
    ingest(other.knowledge_base, ("message:1", "the other secret"))  # (its memory base's own)
    added = alice_client.post(f"/api/v1/knowledge-bases/{docs.pk}/documents",
                              {"documents": [{"text": "a public note"}]}, format="json")  # fmt: skip
    assert added.status_code in (200, 201), added.content
    key = _narrowed(alice, memory_bases=[str(mine.pk)], memory_stores=[])
    listed = _names(key.get("/api/v1/knowledge-bases"))
    assert listed == sorted(["docs", mine.knowledge_base.name]), listed
    assert key.get(f"/api/v1/knowledge-bases/{mine.knowledge_base.pk}").status_code == 200
    assert key.get(f"/api/v1/knowledge-bases/{docs.pk}").status_code == 200
    held = other.knowledge_base
    url = f"/api/v1/knowledge-bases/{held.pk}"
    refused = _refused(key.get(url))
    assert refused["details"] == {"memory_bases": str(other.pk)}
    _refused(key.get(f"{url}/chunks"))
    _refused(key.patch(url, {"description": "changed"}, format="json"))
    _refused(key.post(f"{url}/documents", {"documents": [{"text": "injected"}]}, format="json"))
    _refused(key.post(f"{url}/search", {"query": "secret"}, format="json"))
    _refused(key.post("/api/v1/search", {"query": "secret", "knowledge_base_ids": [str(held.pk)]},
                      format="json"))  # fmt: skip
    _refused(key.get(f"/api/v1/knowledge-bases/{files.pk}"))  # (the store's)
    found = key.post("/api/v1/search", {"query": "secret note", "mode": "keyword",
                                        "include_memory_bases": True}, format="json")  # fmt: skip
    assert found.status_code == 200, found.content
    assert [h["text"] for h in found.json()["results"]] == ["a public note"]
    held.refresh_from_db()
    assert held.description == "" and held.chunks.count() == 1
    assert store.knowledge_base_id == files.pk


def test_a_key_narrowed_to_memory_stores(alice, alice_client):
    mine, _ = memory_store_create(owner=alice, name="mine", type="simple", config=None)
    other, _ = memory_store_create(owner=alice, name="other", type="simple", config=None)
    key = _narrowed(alice, memory_stores=[str(mine.pk)])
    assert _names(key.get("/api/v1/memory-stores")) == ["mine"]
    assert _names(alice_client.get("/api/v1/memory-stores")) == ["mine", "other"]
    url = f"/api/v1/memory-stores/{other.pk}"
    assert key.get(f"/api/v1/memory-stores/{mine.pk}").status_code == 200
    _refused(key.get(url))
    _refused(key.get(f"{url}/items"))
    _refused(key.patch(url, {"name": "renamed"}, format="json"))
    _refused(key.delete(url))
    _refused(key.post(f"{url}/load", {}, format="json"))
    _refused(key.post("/api/v1/memory-stores", {"name": "new", "type": "simple"}, format="json"))
    other.refresh_from_db()
    assert other.name == "other" and MemoryStore.objects.filter(owner=alice).count() == 2


# --- one end user (a scope): REST, the tools, the proxy -------------------------------


@pytest.fixture
def two_users(alice):
    for user in ("u1", "u2"):
        end_user = end_user_ensure(owner=alice, external_id=user)
        fact_add(owner=alice, scope=end_user, facts=[FactIn(f"{user} lives in Lisbon")],
                 reason="seed")  # fmt: skip
    fact_add(owner=alice, scope=global_scope_ensure(owner=alice),
             facts=[FactIn("The company is Acme")], reason="seed")  # fmt: skip


def _facts() -> list[tuple[str, list[str]]]:
    return sorted((f.content, list(s.path)) for f in Fact.objects.all() for s in
                  Scope.objects.filter(links__fact=f))  # fmt: skip


def test_a_key_narrowed_to_one_end_user_over_rest(alice, two_users):
    key = _narrowed(alice, scope=U1)
    before = _facts()
    u2_fact = Fact.objects.get(content="u2 lives in Lisbon")
    glob = Fact.objects.get(content="The company is Acme")
    found = key.get("/api/v1/users/u1/memories").json()["results"]
    assert [m["content"] for m in found] == ["u1 lives in Lisbon"]
    searched = key.post("/api/v1/engine/search", {"scope": U1, "query": "Lisbon"}, format="json")
    assert [h["content"] for h in searched.json()["results"]] == ["u1 lives in Lisbon"]
    _refused(key.get("/api/v1/users/u2/memories"))
    _refused(key.post("/api/v1/users/u2/memories", {"text": "x", "infer": False}, format="json"))
    _refused(key.post("/api/v1/users/u2/memories", {"text": "x", "infer": True}, format="json"))
    _refused(key.delete("/api/v1/users/u2/memories"))
    _refused(key.post("/api/v1/users/u2/memories/search", {"query": "Lisbon"}, format="json"))
    _refused(key.delete(f"/api/v1/users/u2/memories/{u2_fact.pk}"))
    _refused(key.get("/api/v1/users/u3/memories"))
    _refused(key.get("/api/v1/engine/facts", {"scope": json.dumps(U2)}))
    _refused(key.post("/api/v1/engine/facts", {"scope": U2, "content": "x"}, format="json"))
    _refused(key.post("/api/v1/engine/facts", {"scope": ["org", "acme"], "content": "x"},
                      format="json"))  # fmt: skip
    _refused(key.get(f"/api/v1/engine/facts/{u2_fact.pk}"))
    _refused(key.delete(f"/api/v1/engine/facts/{u2_fact.pk}"))
    _refused(key.patch(f"/api/v1/engine/facts/{u2_fact.pk}", {"content": "y"}, format="json"))
    _refused(key.get(f"/api/v1/engine/facts/{u2_fact.pk}/history"))
    _refused(key.post("/api/v1/engine/search", {"scope": U2, "query": "Lisbon"}, format="json"))
    _refused(key.post("/api/v1/engine/erase", {"scope": U2}, format="json"))
    _refused(key.post("/api/v1/engine/flush", {"scope": U2, "messages": [
        {"role": "user", "content": "I moved"}]}, format="json"))  # fmt: skip
    _refused(key.get("/api/v1/engine/journal", {"scope": json.dumps(U2)}))
    _refused(key.get("/api/v1/global-memories"))
    _refused(key.post("/api/v1/global-memories", {"content": "x"}, format="json"))
    _refused(key.delete(f"/api/v1/global-memories/{glob.pk}"))
    assert _facts() == before
    assert not Scope.objects.filter(external_id="u3").exists()


def test_a_refusal_of_something_asked_for_by_id_does_not_name_its_scope(alice, two_users):
    """A fact, a fact's history (of a deleted one too) or a dream of another end user,
    asked for by id with a key limited to one end user: refused, without the other end
    user's scope (its path, so its id, was in the message and the details)."""
    from memories.engine.models import Dream
    from memories.facts.services import fact_delete

    key = _narrowed(alice, scope=U1)
    u2 = Scope.objects.get(owner=alice, path=U2)
    u2_fact = Fact.objects.get(content="u2 lives in Lisbon")
    gone = fact_add(owner=alice, scope=u2, facts=[FactIn("u2 has a cat")], reason="seed")[0]
    fact_delete(owner=alice, fact_id=gone.fact_id, scope=u2, reason="seed")
    dream = Dream.objects.create(owner=alice, scope=u2, lookback_days=1, input_hash="x" * 64)
    for response in (
        key.get(f"/api/v1/engine/facts/{u2_fact.pk}"),
        key.get(f"/api/v1/engine/facts/{u2_fact.pk}/history"),
        key.get(f"/api/v1/engine/facts/{gone.fact_id}/history"),
        key.get(f"/api/v1/engine/dreams/{dream.pk}"),
        key.post(f"/api/v1/engine/dreams/{dream.pk}/undo"),
    ):
        error = _refused(response)
        assert "u2" not in response.content.decode(), error
        assert error["details"] == {"scope": None}
        assert error["message"] == (
            "this API key is limited to the scope ['user', 'u1']; what you asked for is outside it"
        )
    # a scope the client names itself is named back
    assert _refused(key.get("/api/v1/engine/facts", {"scope": json.dumps(U2)}))["details"] == {
        "scope": U2
    }
    dream.refresh_from_db()
    assert dream.undone_at is None


def test_a_key_narrowed_to_one_end_user_through_the_tools(alice, two_users):
    key = _narrowed(alice, scope=U1)
    before = _facts()
    refused = key.post("/api/v1/tools/manage_memory/call",
                       {"scope": U2, "arguments": {"content": "u2 likes tea"}}, format="json")  # fmt: skip
    _refused(refused)
    _refused(key.post("/api/v1/tools/search_memory/call",
                      {"scope": U2, "arguments": {"query": "Lisbon"}}, format="json"))  # fmt: skip
    _refused(key.post("/api/v1/tools/search_memory/call",
                      {"scope": ["user", "{user_id}"], "arguments": {"query": "Lisbon"}},
                      format="json", HTTP_X_OPENWEBUI_USER_ID="u2"))  # fmt: skip
    assert _facts() == before
    added = key.post("/api/v1/tools/manage_memory/call",
                     {"scope": U1, "arguments": {"content": "u1 likes tea"}}, format="json")  # fmt: skip
    assert added.status_code == 200 and added.json()["result"]["action"] == "created"


def test_a_key_narrowed_to_one_end_user_through_the_proxy(
    alice, two_users, llm_settings, openai_server
):
    key = _narrowed(alice, scope=U1)
    body = {"model": "m", "messages": [{"role": "user", "content": "Where do I live?"}]}
    for header in ({"HTTP_X_OPENWEBUI_USER_ID": "u2"}, {}):
        refused = key.post("/v1/chat/completions", body, format="json", **header)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "key_limit"  # (OpenAI's error shape)
    refused = key.post("/v1/chat/completions", {**body, "user": "u3"}, format="json")
    assert refused.status_code == 403
    assert openai_server.requests == []
    assert not Scope.objects.filter(external_id="u3").exists()
    openai_server.push(Scripted(body=chat_body("In Lisbon.")))
    answered = key.post("/v1/chat/completions", body, format="json",
                        HTTP_X_OPENWEBUI_USER_ID="u1")  # fmt: skip
    assert answered.status_code == 200, answered.content
    sent = json.dumps(openai_server.requests[0]["json"])
    assert "u1 lives in Lisbon" in sent and "u2 lives in Lisbon" not in sent


# --- tools (REST and the proxy's tool loop) ---------------------------------------------


def test_a_key_narrowed_to_named_tools(alice, two_users, llm_settings, openai_server):
    key = _narrowed(alice, tools=["search_memory"])
    listed = [t["function"]["name"] for t in key.get("/api/v1/tools").json()["tools"]]
    assert listed == ["search_memory"]
    before = _facts()
    refused = _refused(key.post("/api/v1/tools/manage_memory/call",
                                {"scope": U1, "arguments": {"content": "u1 likes tea"}},
                                format="json"))  # fmt: skip
    assert "search_memory" in refused["message"]
    assert _facts() == before
    found = key.post("/api/v1/tools/search_memory/call",
                     {"scope": U1, "arguments": {"query": "Lisbon"}}, format="json")  # fmt: skip
    assert found.status_code == 200
    # The proxy's tool loop offers the model only the key's tools.
    openai_server.push(Scripted(body=chat_body("Noted.")))
    chat = key.post("/v1/chat/completions",
                    {"model": "m", "memory_tools": True,
                     "messages": [{"role": "user", "content": "I like tea"}]},
                    format="json", HTTP_X_OPENWEBUI_USER_ID="u1")  # fmt: skip
    assert chat.status_code == 200, chat.content
    offered = [t["function"]["name"] for t in openai_server.requests[0]["json"]["tools"]]
    assert offered == ["search_memory"]


def test_a_narrowed_key_does_nothing_that_spans_the_account(alice):
    key = _narrowed(alice, scope=U1)
    keys = APIKey.objects.count()
    _refused(key.post("/api/v1/api-keys", {"name": "wider"}, format="json"))
    _refused(key.delete(f"/api/v1/api-keys/{APIKey.objects.first().pk}"))
    _refused(key.patch("/api/v1/me", {"background_daily_tokens": 5}, format="json"))
    _refused(key.get("/api/v1/export"))
    _refused(key.post("/api/v1/import", "{}", content_type="application/x-ndjson"))
    _refused(key.get("/api/v1/memory-config"))
    _refused(key.get("/api/v1/usage"))
    _refused(key.patch("/api/v1/engine/settings", {}, format="json"))
    # Reading the account's keys (their names and limits) or its settings spans it too.
    _refused(key.get("/api/v1/api-keys"))
    _refused(key.get(f"/api/v1/api-keys/{APIKey.objects.first().pk}"))
    _refused(key.get("/api/v1/engine/settings"))
    assert APIKey.objects.count() == keys and APIKey.objects.filter(revoked_at=None).count() == keys
    assert not UsageBudget.objects.exists()
    assert key.get("/api/v1/me").status_code == 200


def test_a_key_that_expires_makes_and_revokes_only_keys_that_end_no_later(alice):
    ends = timezone.now() + timedelta(days=30)
    temporary, raw = api_key_create(owner=alice, name="temporary", expires_at=ends)
    lasting, _ = api_key_create(owner=alice, name="lasting")
    later, _ = api_key_create(owner=alice, name="later", expires_at=ends + timedelta(days=1))
    key = _client(raw)
    keys = APIKey.objects.count()
    for body in ({"name": "forever"}, {"name": "longer", "expires_at": (ends + timedelta(
            seconds=1)).isoformat()}):  # fmt: skip
        refused = _refused(key.post("/api/v1/api-keys", body, format="json"))
        assert refused["details"] == {"expires_at": ends.isoformat()}
    _refused(key.delete(f"/api/v1/api-keys/{lasting.pk}"))
    _refused(key.delete(f"/api/v1/api-keys/{later.pk}"))
    assert APIKey.objects.count() == keys and APIKey.objects.filter(revoked_at=None).count() == keys
    assert not AccessEvent.objects.filter(action="key_revoked").exists()
    # A key that ends no later is made, and revoked.
    made = key.post("/api/v1/api-keys", {"name": "shorter", "expires_at": ends.isoformat()},
                    format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    assert key.delete(f"/api/v1/api-keys/{made.json()['id']}").status_code == 200
    assert key.delete(f"/api/v1/api-keys/{temporary.pk}").status_code == 200  # (itself)


# --- MCP ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_narrowed_key_over_mcp(alice, two_users):
    other = flow_create(owner=alice, name="other")
    key = _narrowed(alice, scope=U1, tools=["search_memory", "write_node_memory"],
                    flows=[])  # fmt: skip
    before = (_facts(), Message.objects.count())
    listed = sorted(t["name"] for t in _rpc(key, "tools/list")["result"]["tools"])
    assert listed == ["search_memory", "write_node_memory"]
    refused = _rpc(key, "tools/call", {"name": "manage_memory",
                                       "arguments": {"scope": U1, "content": "u1 likes tea"}})  # fmt: skip
    assert (
        refused["result"]["isError"] is True
        and "limited" in refused["result"]["content"][0]["text"]
    )
    outside = _rpc(key, "tools/call", {"name": "search_memory",
                                       "arguments": {"scope": U2, "query": "Lisbon"}})  # fmt: skip
    assert outside["result"]["isError"] is True and "u1" in outside["result"]["content"][0]["text"]
    flow = _rpc(key, "tools/call", {"name": "write_node_memory", "arguments": {
        "flow": str(other.pk), "node_id": "answer", "input": "q", "output": "a"}})  # fmt: skip
    assert flow["result"]["isError"] is True
    found = _rpc(key, "tools/call", {"name": "search_memory",
                                     "arguments": {"scope": U1, "query": "Lisbon"}})  # fmt: skip
    assert found["result"]["structuredContent"]["results"][0]["content"] == "u1 lives in Lisbon"
    uris = [r["uri"] for r in _rpc(key, "resources/list")["result"]["resources"]]
    assert uris == ["memory://scope/user,u1/MEMORY.md"]
    read = _rpc(key, "resources/read", {"uri": "memory://scope/user,u2/MEMORY.md"})
    assert "error" in read
    assert (_facts(), Message.objects.count()) == before


def test_a_flows_node_reaches_only_the_keys_stores(alice):
    """Node memory (REST and the tools) goes through the node's attachments: a key
    narrowed to named stores writes and reads those, and leaves the others as they are."""
    flow = flow_create(owner=alice, name="bot")
    plain = {"embedding": {"provider": "none"}}
    mine, _ = memory_store_create(owner=alice, name="mine", type="simple", config=plain)
    other, _ = memory_store_create(owner=alice, name="other", type="simple", config=plain)
    for position, store in enumerate((mine, other)):
        MemoryAttachment.objects.create(flow=flow, node_id="answer", store=store,
                                        position=position)  # fmt: skip
    key = _narrowed(alice, memory_stores=[str(mine.pk)])
    args = {
        "flow": str(flow.pk),
        "node_id": "answer",
        "input": "Where?",
        "output": "The user lives in Lisbon, Portugal.",
    }
    written = key.post("/api/v1/tools/write_node_memory/call", {"arguments": args},
                       format="json")  # fmt: skip
    assert written.status_code == 200, written.content
    assert [s["store"] for s in written.json()["result"]["results"]] == ["mine"]
    url = f"/api/v1/flows/{flow.pk}/nodes/answer/memory"
    rest = key.post(
        f"{url}/write", {"input": "When?", "output": "The user moved there in 2024."}, format="json"
    )
    assert rest.status_code == 200, rest.content
    retrieved = key.post(f"{url}/retrieve", {"stage": "pre", "query": "Lisbon"}, format="json")
    assert [s["store"] for s in retrieved.json()["stores"]] == ["mine"]
    assert MemoryItem.objects.filter(store=mine).count() == 2
    assert not MemoryItem.objects.filter(store=other).exists()
