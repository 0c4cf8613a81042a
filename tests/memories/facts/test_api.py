"""Direct memory API under /api/v1/users/{user_id}/memories, and /metrics."""

from __future__ import annotations

import pytest

from memories.facts.models import EndUser, MemoryUpdate, UserVector, Vector
from memories.facts.services import end_user_ensure, memory_add
from tests.memories.engine.scripted import engine_storage  # noqa: F401

pytestmark = pytest.mark.django_db
BASE = "/api/v1/users/u1/memories"
ERR = {"code", "message", "details"}


@pytest.fixture(autouse=True)
def _embedder(fixture_embedder):
    return fixture_embedder


def _add(client, text, user="u1"):
    return client.post(
        f"/api/v1/users/{user}/memories", {"text": text, "infer": False}, format="json"
    )


def test_add_as_given_list_get(alice_client):
    response = _add(alice_client, "User plays the violin")
    assert response.status_code == 201
    (memory,) = response.json()["memories"]
    assert memory["content"] == "User plays the violin" and memory["type"] == "memory"
    again = _add(alice_client, "user plays the violin.")
    assert again.status_code == 200
    assert again.json()["memories"] == [] and again.json()["duplicates"][0]["id"] == memory["id"]
    listed = alice_client.get(BASE).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == memory["id"]
    assert alice_client.get(f"{BASE}/{memory['id']}").json()["content"] == "User plays the violin"


def test_add_messages_as_given_stores_user_messages(alice_client):
    body = {
        "messages": [
            {"role": "user", "content": "User plays the violin"},
            {"role": "assistant", "content": "Nice"},
        ],
        "infer": False,
    }
    response = alice_client.post(BASE, body, format="json")
    assert [m["content"] for m in response.json()["memories"]] == ["User plays the violin"]


@pytest.mark.usefixtures("engine_storage")
def test_infer_extracts_facts(alice_client, llm_settings, openai_server):
    from tests.memories.engine.scripted import EngineLLM, fact

    message = "I drink green tea every morning and I play the violin"
    script = EngineLLM({message: [fact("User drinks green tea every morning", "behavior", 0.95),
                                  fact("User plays the violin", "knowledge", 0.9),
                                  fact("User likes JavaScript", "preference", 0.4)]})  # fmt: skip
    openai_server.chat_fn = script
    response = alice_client.post(BASE, {"text": message}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert [(d["fact"], d["action"]) for d in body["decisions"]] == [
        ("User drinks green tea every morning", "add"),
        ("User plays the violin", "add"),
        ("User likes JavaScript", "below_threshold"),
    ]
    assert (body["update"]["status"], body["update"]["source"]) == ("done", "api")
    assert body["update"]["scope"] == ["user", "u1"]
    assert script.calls["extraction"] == 1
    assert alice_client.get(BASE).json()["count"] == 2
    stored = {v.content: (v.category, v.confidence) for v in Vector.objects.all()}
    assert stored == {"User drinks green tea every morning": ("behavior", 0.95),
                      "User plays the violin": ("knowledge", 0.9)}  # fmt: skip


def test_infer_without_llm_is_503_and_writes_nothing(alice_client, settings):
    settings.LLM_BASE_URL = ""
    response = alice_client.post(BASE, {"text": "I play the violin"}, format="json")
    assert response.status_code == 503
    assert response.json()["error"]["details"] == {"variable": "LLM_BASE_URL"}
    assert not EndUser.objects.exists() and not Vector.objects.exists()


def test_search_with_threshold_and_decay(alice, alice_client):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    memory_add(end_user=end_user, content="User uses Node.js")
    memory_add(end_user=end_user, content="User is allergic to peanuts")
    results = alice_client.get(
        f"{BASE}/search",
        {"q": "Which JavaScript runtime should I use for my server?", "threshold": 0.3},
    ).json()["results"]
    assert [r["content"] for r in results] == ["User uses Node.js"]
    assert results[0]["similarity"] == pytest.approx(0.441, abs=0.002)
    decayed = alice_client.get(
        f"{BASE}/search",
        {
            "q": "Which JavaScript runtime should I use for my server?",
            "top_k": 1,
            "half_life_days": 1,
        },
    ).json()["results"]
    assert decayed[0]["score"] <= decayed[0]["similarity"]


def test_update_records_history_and_delete(alice_client):
    memory_id = _add(alice_client, "User uses Bun").json()["memories"][0]["id"]
    patched = alice_client.patch(
        f"{BASE}/{memory_id}", {"content": "User uses Node.js"}, format="json"
    )
    assert patched.status_code == 200 and patched.json()["content"] == "User uses Node.js"
    history = alice_client.get(f"{BASE}/{memory_id}/history").json()["results"]
    assert [(h["action"], h["old_content"], h["new_content"]) for h in history] == [
        ("add", "", "User uses Bun"),
        ("update", "User uses Bun", "User uses Node.js"),
    ]
    assert alice_client.delete(f"{BASE}/{memory_id}").status_code == 204
    assert alice_client.get(f"{BASE}/{memory_id}").status_code == 404
    assert not Vector.objects.exists()
    assert [h["action"] for h in alice_client.get(f"{BASE}/{memory_id}/history").json()["results"]][
        -1
    ] == "delete"


def test_update_of_a_shared_memory_copies_on_write(alice, alice_client):
    from memories.facts.services import memory_link

    memory_id = _add(alice_client, "User uses Bun").json()["memories"][0]["id"]
    memory_link(
        end_user=end_user_ensure(owner=alice, external_id="u2"),
        vector=Vector.objects.get(pk=memory_id),
    )
    new = alice_client.patch(
        f"{BASE}/{memory_id}", {"content": "User uses Node.js"}, format="json"
    ).json()
    assert new["id"] != memory_id
    assert Vector.objects.get(pk=memory_id).content == "User uses Bun"  # u2 keeps it
    assert [
        m["content"] for m in alice_client.get("/api/v1/users/u2/memories").json()["results"]
    ] == ["User uses Bun"]


def test_erasure_removes_everything_of_the_user(alice_client):
    _add(alice_client, "User uses Bun")
    _add(alice_client, "User plays the violin")
    _add(alice_client, "User plays the violin", user="u2")
    response = alice_client.delete(BASE)
    assert response.json() == {"deleted": 2}
    assert not EndUser.objects.filter(external_id="u1").exists()
    assert not MemoryUpdate.objects.filter(end_user__external_id="u1").exists()
    assert list(Vector.objects.values_list("content", flat=True)) == [
        "User plays the violin"
    ]  # u2's own copy
    assert alice_client.delete(BASE).status_code == 404


def test_tenancy_another_owner_sees_nothing_and_changes_nothing(
    alice_client, bob_client, anon_client
):
    memory_id = _add(alice_client, "User uses Bun").json()["memories"][0]["id"]
    for client, expected in ((bob_client, 404), (anon_client, 401)):
        assert client.get(f"{BASE}/{memory_id}").status_code == expected
        assert (
            client.patch(f"{BASE}/{memory_id}", {"content": "hijacked"}, format="json").status_code
            == expected
        )
        assert client.delete(f"{BASE}/{memory_id}").status_code == expected
        assert client.get(f"{BASE}/{memory_id}/history").status_code == expected
        assert client.delete(BASE).status_code == expected
    assert bob_client.get(BASE).json()["count"] == 0  # bob's "u1" is another person
    assert bob_client.get(f"{BASE}/search", {"q": "User uses Bun"}).json() == {"results": []}
    assert anon_client.get(BASE).status_code == 401
    assert Vector.objects.get(pk=memory_id).content == "User uses Bun"
    assert UserVector.objects.count() == 1


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("post", "/api/v1/users/bad%20id/memories", {"text": "x", "infer": False}),
        ("post", BASE, {"text": "   ", "infer": False}),
        ("post", BASE, {"infer": False}),
        (
            "post",
            BASE,
            {"text": "a", "messages": [{"role": "user", "content": "b"}], "infer": False},
        ),
        ("post", BASE, {"text": "x" * 2001, "infer": False}),
        ("get", f"{BASE}/search", None),
        ("get", f"{BASE}/search?q=x&top_k=0", None),
    ],
)
def test_bad_input_is_400_and_writes_nothing(alice_client, method, url, body):
    response = (
        getattr(alice_client, method)(url, body, format="json")
        if body is not None
        else alice_client.get(url)
    )
    assert response.status_code == 400
    assert set(response.json()["error"]) == ERR
    assert not Vector.objects.exists() and not EndUser.objects.exists()


def test_global_memories_api(alice_client, bob_client):
    response = alice_client.post(
        "/api/v1/global-memories",
        {"content": "The API rate limit is 100 requests per minute"},
        format="json",
    )
    assert response.status_code == 201
    memory_id = response.json()["id"]
    assert [m["id"] for m in alice_client.get("/api/v1/global-memories").json()["results"]] == [
        memory_id
    ]
    assert bob_client.get("/api/v1/global-memories").json()["count"] == 0
    assert bob_client.delete(f"/api/v1/global-memories/{memory_id}").status_code == 404
    assert alice_client.delete(f"/api/v1/global-memories/{memory_id}").status_code == 204
    assert not Vector.objects.exists()


def test_metrics_in_prometheus_format(client, alice, settings):
    from core.metrics import counter_add

    end_user = end_user_ensure(owner=alice, external_id="u1")
    memory_add(end_user=end_user, content="User uses Bun")
    counter_add("memory_dedup_total", 3)
    settings.METRICS_TOKEN = "secret"
    body = client.get("/metrics", HTTP_AUTHORIZATION="Bearer secret").content.decode()
    assert "# TYPE memory_total_count gauge\nmemory_total_count 1\n" in body
    assert "memory_additions_total 1\n" in body
    assert "memory_dedup_total 3\n" in body
    assert "memory_replacements_total 0\n" in body
    assert client.get("/metrics").status_code == 401


def test_adds_as_given_go_through_the_engine_max_facts_audited(alice, alice_client, settings):
    """An end user's scope cannot grow without bound through the direct API: explicit
    adds take the engine's write path (confidence 1.0, source "api"), and past
    ENGINE_MAX_FACTS the oldest fact is evicted, audited."""
    settings.ENGINE_MAX_FACTS = 2
    first = _add(alice_client, "User plays the violin").json()["memories"][0]
    _add(alice_client, "User uses Bun")
    third = _add(alice_client, "User prefers dark mode")
    assert third.status_code == 201
    body = third.json()
    assert [m["content"] for m in body["memories"]] == ["User prefers dark mode"]
    assert body["evicted"] == [first["id"]]
    assert sorted(m["content"] for m in alice_client.get(BASE).json()["results"]) == [
        "User prefers dark mode", "User uses Bun",
    ]  # fmt: skip
    (eviction,) = MemoryUpdate.objects.filter(action="evict")
    assert (eviction.old_content, eviction.reason) == (
        "User plays the violin", "max_facts 2 reached (added through the API)",
    )  # fmt: skip
    stored = Vector.objects.get(content="User prefers dark mode")
    assert (stored.confidence, stored.category, stored.source_kind) == (1.0, "context", "api")
    assert not Vector.objects.filter(pk=first["id"]).exists()  # nobody else links it
