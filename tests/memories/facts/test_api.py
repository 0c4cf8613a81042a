"""The personal memories API under /api/v1/users/{user_id}/memories, global memories, and
/metrics: views over the one write service and the one search, answering a fact's one
shape and vocabulary (older names as aliases)."""

from __future__ import annotations

import pytest

from memories.facts.models import Fact, FactChange, FactLink, Scope
from memories.facts.scopes import end_user_ensure
from memories.facts.services import fact_share
from tests.memories.engine.scripted import engine_storage  # noqa: F401
from tests.memories.facts.seed import seed

pytestmark = pytest.mark.django_db
BASE = "/api/v1/users/u1/memories"
ERR = {"code", "message", "details"}
QUESTION = "Which JavaScript runtime should I use for my server?"
SHAPE = {"id", "content", "category", "confidence", "source", "metadata", "observed_at",
         "created_at", "updated_at", "valid_from", "valid_to", "recorded_from",
         "recorded_to"}  # fmt: skip


@pytest.fixture(autouse=True)
def _embedder(fixture_embedder):
    return fixture_embedder


def _add(client, text, user="u1", **extra):
    return client.post(
        f"/api/v1/users/{user}/memories", {"text": text, "infer": False, **extra}, format="json"
    )


def test_add_as_given_list_get_in_the_facts_shape(alice_client):
    response = _add(alice_client, "User plays the violin", metadata={"from": "test"})
    assert response.status_code == 201
    (memory,) = response.json()["memories"]
    assert set(memory) == SHAPE | {"type"}
    assert (memory["content"], memory["category"], memory["confidence"]) == (
        "User plays the violin", "context", 1.0,
    )  # fmt: skip
    assert (memory["source"], memory["metadata"], memory["type"]) == (
        {"kind": "api", "ref": ""}, {"from": "test"}, "memory",
    )  # fmt: skip
    again = _add(alice_client, "user plays the violin.")
    assert again.status_code == 200
    assert again.json()["memories"] == [] and again.json()["duplicates"][0]["id"] == memory["id"]
    listed = alice_client.get(BASE).json()
    assert listed["count"] == 1 and listed["results"][0] == memory
    assert alice_client.get(f"{BASE}/{memory['id']}").json() == memory
    # The engine's door answers the same fact in the same shape (without the alias).
    engine = alice_client.get(f"/api/v1/engine/facts/{memory['id']}").json()
    assert {k: v for k, v in memory.items() if k != "type"} == {
        k: v for k, v in engine.items() if k != "scope"
    }


def test_add_as_given_takes_category_and_confidence(alice_client):
    response = _add(alice_client, "User prefers dark mode", category="preference", confidence=0.8)
    (memory,) = response.json()["memories"]
    assert (memory["category"], memory["confidence"]) == ("preference", 0.8)


def test_an_add_below_the_threshold_writes_nothing_and_makes_no_end_user(alice_client):
    response = _add(alice_client, "User may like jazz", user="u7", confidence=0.5)
    assert response.status_code == 200, response.content
    assert response.json() == {"memories": [], "duplicates": [], "evicted": [], "below_threshold": [
        {"content": "User may like jazz", "reason": "confidence 0.5 < 0.7"}]}  # fmt: skip
    assert not Scope.objects.exists() and not Fact.objects.exists()
    assert alice_client.get("/api/v1/users/u7/memories").status_code == 404
    assert _add(alice_client, "User prefers dark mode", user="u7").status_code == 201  # made


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
    response = alice_client.post(BASE, {"content": message}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert [(d["content"], d["action"]) for d in body["decisions"]] == [
        ("User drinks green tea every morning", "add"),
        ("User plays the violin", "add"),
        ("User likes JavaScript", "below_threshold"),
    ]
    # The older names are echoed: fact for content, memory_id for fact_id.
    assert all(
        d["fact"] == d["content"] and d["memory_id"] == d["fact_id"] for d in body["decisions"]
    )
    assert body["decisions"][0]["fact_id"] is not None
    assert (body["update"]["status"], body["update"]["source"]) == ("done", "api")
    assert body["update"]["scope"] == ["user", "u1"]
    assert script.calls["extraction"] == 1
    assert alice_client.get(BASE).json()["count"] == 2
    stored = {v.content: (v.category, v.confidence) for v in Fact.objects.all()}
    assert stored == {"User drinks green tea every morning": ("behavior", 0.95),
                      "User plays the violin": ("knowledge", 0.9)}  # fmt: skip


def test_infer_without_llm_is_503_and_writes_nothing(alice_client, settings):
    settings.LLM_BASE_URL = ""
    response = alice_client.post(BASE, {"text": "I play the violin"}, format="json")
    assert response.status_code == 503
    assert response.json()["error"]["details"] == {"variable": "LLM_BASE_URL"}
    assert not Scope.objects.exists() and not Fact.objects.exists()


def test_search_is_the_engines_search_post_and_get(alice, alice_client):
    """The personal search is a POST like every search (GET stays an alias with q and
    top_k): the same hits, in the same order, with the same scores as /engine/search."""
    seed(end_user_ensure(owner=alice, external_id="u1"), "User uses Node.js",
         "User is allergic to peanuts")  # fmt: skip
    posted = alice_client.post(f"{BASE}/search", {"query": QUESTION}, format="json").json()
    engine = alice_client.post(
        "/api/v1/engine/search", {"scope": ["user", "u1"], "query": QUESTION}, format="json"
    ).json()
    got = alice_client.get(f"{BASE}/search", {"q": QUESTION, "top_k": 10}).json()
    assert posted["scope"] == engine["scope"] == got["scope"] == ["user", "u1"]
    assert posted["mode"] == engine["mode"] == "hybrid"

    # (the scores decay with the time of each call: the same to a few parts in 10^9)
    def strip(hits):
        return [{k: v for k, v in h.items() if k not in ("type", "score")} for h in hits]

    assert strip(posted["results"]) == strip(engine["results"]) == strip(got["results"])
    for a, b in zip(posted["results"], engine["results"], strict=True):
        assert a["score"] == pytest.approx(b["score"], rel=1e-6)
    assert [r["content"] for r in posted["results"]] == [
        "User uses Node.js", "User is allergic to peanuts",
    ]  # fmt: skip
    first = posted["results"][0]
    assert set(first) == SHAPE | {"score", "similarity", "keyword_score", "type"}
    assert first["similarity"] == pytest.approx(0.441, abs=0.002)
    assert first["score"] > first["similarity"]  # hybrid: the keyword leg counts too


def test_search_threshold_alias_and_decay(alice, alice_client):
    seed(end_user_ensure(owner=alice, external_id="u1"), "User uses Node.js",
         "User is allergic to peanuts")  # fmt: skip
    results = alice_client.get(f"{BASE}/search", {"q": QUESTION, "threshold": 0.3}).json()
    assert [r["content"] for r in results["results"]] == ["User uses Node.js"]
    decayed = alice_client.post(
        f"{BASE}/search", {"query": QUESTION, "limit": 1, "half_life_days": 0.001}, format="json"
    ).json()["results"]
    plain = alice_client.post(
        f"{BASE}/search", {"query": QUESTION, "limit": 1, "half_life_days": 0}, format="json"
    ).json()["results"]
    assert decayed[0]["id"] == plain[0]["id"] and decayed[0]["score"] < plain[0]["score"]
    both = alice_client.post(f"{BASE}/search", {"query": QUESTION, "q": "other"}, format="json")
    assert both.status_code == 400
    assert both.json()["error"]["message"] == "query: Give query or q (the same field), not both."


def test_update_records_history_and_delete(alice_client):
    memory_id = _add(alice_client, "User uses Bun").json()["memories"][0]["id"]
    patched = alice_client.patch(
        f"{BASE}/{memory_id}", {"text": "User uses Node.js"}, format="json"
    )
    assert patched.status_code == 200 and patched.json()["content"] == "User uses Node.js"
    patched = alice_client.patch(
        f"{BASE}/{memory_id}", {"category": "preference", "confidence": 0.9, "reason": "said so"},
        format="json",
    )  # fmt: skip
    assert (patched.json()["category"], patched.json()["confidence"]) == ("preference", 0.9)
    history = alice_client.get(f"{BASE}/{memory_id}/history").json()["results"]
    assert [(h["action"], h["old_content"], h["new_content"], h["reason"]) for h in history] == [
        ("add", "", "User uses Bun", "added through the API"),
        ("update", "User uses Bun", "User uses Node.js", "edited"),
        ("update", "User uses Node.js", "User uses Node.js", "said so"),
    ]
    # old_fact / new_fact, and their older names
    assert all(h["old_fact"] == h["old_fact"] and h["new_fact"] == h["new_fact"] for h in history)
    assert history[0]["new_fact"] == memory_id and history[0]["old_fact"] is None
    assert alice_client.delete(f"{BASE}/{memory_id}").status_code == 204
    gone = alice_client.get(f"{BASE}/{memory_id}")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "fact_not_found")
    assert not Fact.objects.exists()
    actions = [
        h["action"] for h in alice_client.get(f"{BASE}/{memory_id}/history").json()["results"]
    ]
    assert actions[-1] == "delete"


def test_update_of_a_shared_memory_copies_on_write(alice, alice_client):
    memory_id = _add(alice_client, "User uses Bun").json()["memories"][0]["id"]
    fact_share(
        scope=end_user_ensure(owner=alice, external_id="u2"), fact=Fact.objects.get(pk=memory_id)
    )
    new = alice_client.patch(
        f"{BASE}/{memory_id}", {"content": "User uses Node.js"}, format="json"
    ).json()
    assert new["id"] != memory_id
    assert Fact.objects.get(pk=memory_id).content == "User uses Bun"  # u2 keeps it
    assert [
        m["content"] for m in alice_client.get("/api/v1/users/u2/memories").json()["results"]
    ] == ["User uses Bun"]


def test_erasure_removes_everything_of_the_user(alice_client):
    _add(alice_client, "User uses Bun")
    _add(alice_client, "User plays the violin")
    _add(alice_client, "User plays the violin", user="u2")
    response = alice_client.delete(BASE)
    # the engine's answer ({"scope", "facts_removed"}), and "deleted", its older name
    assert response.json() == {"scope": ["user", "u1"], "facts_removed": 2, "deleted": 2}
    assert not Scope.objects.filter(external_id="u1").exists()
    assert not FactChange.objects.filter(scope__external_id="u1").exists()
    assert list(Fact.objects.values_list("content", flat=True)) == ["User plays the violin"]
    again = alice_client.delete(BASE)
    assert (again.status_code, again.json()["error"]["code"]) == (404, "scope_not_found")


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
        assert client.get(BASE).status_code == expected  # bob's "u1" is another person
        assert (
            client.post(f"{BASE}/search", {"query": "Bun"}, format="json").status_code == expected
        )
    assert bob_client.get(BASE).json()["error"]["code"] == "scope_not_found"
    assert Fact.objects.get(pk=memory_id).content == "User uses Bun"
    assert FactLink.objects.count() == 1 and FactChange.objects.count() == 1


def test_another_users_memory_is_not_this_users(alice_client):
    memory_id = _add(alice_client, "User uses Bun", user="u2").json()["memories"][0]["id"]
    _add(alice_client, "User plays the violin")
    for call in (
        lambda: alice_client.get(f"{BASE}/{memory_id}"),
        lambda: alice_client.patch(f"{BASE}/{memory_id}", {"content": "x"}, format="json"),
        lambda: alice_client.delete(f"{BASE}/{memory_id}"),
    ):
        response = call()
        assert (response.status_code, response.json()["error"]["code"]) == (404, "fact_not_found")
    assert Fact.objects.get(pk=memory_id).content == "User uses Bun"


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
        ("post", BASE, {"text": "x", "infer": False, "category": "hobby"}),
        ("post", BASE, {"text": "x", "infer": False, "confidence": 2}),
        ("get", f"{BASE}/search", None),
        ("get", f"{BASE}/search?q=x&top_k=0", None),
        ("post", f"{BASE}/search", {"limit": 3}),
        ("post", f"{BASE}/search", {"query": "x", "filter": {"category": "hobby"}}),
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
    assert not Fact.objects.exists() and not Scope.objects.exists()


def test_a_bad_change_is_400_and_changes_nothing(alice_client):
    memory_id = _add(alice_client, "User uses Bun").json()["memories"][0]["id"]
    for body in ({}, {"content": " "}, {"category": "hobby"}, {"confidence": -1},
                 {"content": "a", "text": "b"}):  # fmt: skip
        response = alice_client.patch(f"{BASE}/{memory_id}", body, format="json")
        assert response.status_code == 400, body
        assert set(response.json()["error"]) == ERR
    fact = Fact.objects.get(pk=memory_id)
    assert (fact.content, fact.category, fact.confidence) == ("User uses Bun", "context", 1.0)
    assert FactChange.objects.count() == 1


def test_global_memories_api(alice_client, bob_client):
    fact = "The API rate limit is 100 requests per minute"
    response = alice_client.post("/api/v1/global-memories", {"content": fact}, format="json")
    assert response.status_code == 201
    memory = response.json()
    assert set(memory) == SHAPE | {"type"} and memory["type"] == "global"
    again = alice_client.post("/api/v1/global-memories", {"text": fact}, format="json")
    assert (again.status_code, again.json()["id"]) == (200, memory["id"])  # a duplicate
    assert [m["id"] for m in alice_client.get("/api/v1/global-memories").json()["results"]] == [
        memory["id"]
    ]
    assert bob_client.get("/api/v1/global-memories").json()["count"] == 0
    assert bob_client.delete(f"/api/v1/global-memories/{memory['id']}").status_code == 404
    # A global memory is not a fact of any of the engine's scopes.
    assert alice_client.get(f"/api/v1/engine/facts/{memory['id']}").status_code == 404
    assert alice_client.delete(f"/api/v1/global-memories/{memory['id']}").status_code == 204
    assert not Fact.objects.exists()


def test_metrics_in_prometheus_format(client, alice, settings):
    from core.metrics import counter_add

    seed(end_user_ensure(owner=alice, external_id="u1"), "User uses Bun")
    counter_add("memory_dedup_total", 3)
    settings.METRICS_TOKEN = "secret"
    body = client.get("/metrics", HTTP_AUTHORIZATION="Bearer secret").content.decode()
    assert "# TYPE memory_total_count gauge\nmemory_total_count 1\n" in body
    assert "memory_facts_count 1\n" in body and "memory_scopes_count 1\n" in body
    assert "memory_additions_total 1\n" in body
    assert "memory_dedup_total 3\n" in body
    assert "memory_replacements_total 0\n" in body
    assert "# TYPE engine_llm_calls_total counter\nengine_llm_calls_total 0\n" in body
    assert "memory_llm_calls_total" not in body and "formation" not in body
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
    (eviction,) = FactChange.objects.filter(action="evict")
    assert (eviction.old_content, eviction.reason) == (
        "User plays the violin", "max_facts 2 reached (added through the API)",
    )  # fmt: skip
    stored = Fact.objects.get(content="User prefers dark mode")
    assert (stored.confidence, stored.category, stored.source_kind) == (1.0, "context", "api")
    assert not Fact.objects.filter(pk=first["id"]).exists()  # nobody else links it


@pytest.mark.parametrize("extra", [{"confidence": 0.2}, {"scope": ["user", "u1"]}])
def test_a_global_memory_refuses_what_only_a_fact_takes_and_writes_nothing(alice_client, extra):
    """A global memory has no confidence or scope: such a field was dropped unsaid (an
    audit's ``confidence: 0.2`` came back 1.0)."""
    body = {"text": "The office closes at six", **extra}
    response = alice_client.post("/api/v1/global-memories", body, format="json")
    assert response.status_code == 400
    [key] = extra
    assert response.json()["error"]["details"] == {key: [f"Unknown field {key}."]}
    assert not Fact.objects.exists()


def test_an_add_takes_as_many_messages_as_a_run_and_says_so_flat(alice, alice_client, settings):
    """201 messages were a 400 ("no more than 200 elements", nested under
    non_field_errors) where runs and flushes take RUN_MAX_MESSAGES (500), and docs said so."""
    settings.RUN_MAX_MESSAGES = 3
    said = [{"role": "user", "content": f"I like tea number {i}"} for i in range(4)]
    response = alice_client.post(BASE, {"messages": said, "infer": False}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {"messages": ["At most 3 messages."]}
    assert not Scope.objects.exists()
