"""The engine's REST surface: facts CRUD, search, injection; scoping and errors."""

from __future__ import annotations

import pytest

from memories.facts.models import Fact, FactChange, Scope

pytestmark = pytest.mark.django_db

VIOLIN = "I drink green tea every morning and I play the violin"


def _create(client, scope, content, **extra):
    return client.post(
        "/api/v1/engine/facts", {"scope": scope, "content": content, **extra}, format="json"
    )


def test_create_list_get_patch_delete(alice_client, fixture_embedder):
    r = _create(alice_client, ["org", "acme", "agent-alpha"], "User plays the violin",
                category="behavior", confidence=0.9)  # fmt: skip
    assert r.status_code == 201, r.content
    fact = r.json()["fact"]
    assert (fact["content"], fact["category"], fact["confidence"]) == (
        "User plays the violin", "behavior", 0.9,
    )  # fmt: skip
    assert fact["source"] == {"kind": "api", "ref": ""}
    assert r.json()["decision"]["action"] == "add"
    listed = alice_client.get("/api/v1/engine/facts?scope=org&scope=acme&scope=agent-alpha")
    assert [f["id"] for f in listed.json()["results"]] == [fact["id"]]
    listed = alice_client.get('/api/v1/engine/facts?scope=["org","acme","agent-alpha"]')
    assert listed.json()["count"] == 1
    got = alice_client.get(f"/api/v1/engine/facts/{fact['id']}").json()
    assert (
        got["scope"] == ["org", "acme", "agent-alpha"] and got["content"] == "User plays the violin"
    )
    r = alice_client.patch(
        f"/api/v1/engine/facts/{fact['id']}", {"confidence": 0.75}, format="json"
    )
    assert r.status_code == 200 and r.json()["confidence"] == 0.75
    assert alice_client.delete(f"/api/v1/engine/facts/{fact['id']}").status_code == 204
    assert alice_client.get(f"/api/v1/engine/facts/{fact['id']}").status_code == 404
    assert list(FactChange.objects.order_by("created_at").values_list("action", flat=True)) == [
        "add", "update", "delete",
    ]  # fmt: skip


def test_user_scope_fact_is_a_personal_memory(alice_client, fixture_embedder):
    r = _create(alice_client, ["user", "alice"], "User prefers dark mode", category="preference")
    assert r.status_code == 201
    listed = alice_client.get("/api/v1/users/alice/memories").json()["results"]
    assert [m["content"] for m in listed] == ["User prefers dark mode"]


def test_another_owner_gets_404_and_nothing_changes(
    alice_client, bob_client, anon_client, fixture_embedder
):
    fact = _create(alice_client, ["user", "alice"], "User prefers dark mode").json()["fact"]
    url = f"/api/v1/engine/facts/{fact['id']}"
    assert bob_client.get(url).status_code == 404
    r = bob_client.patch(url, {"confidence": 0.1}, format="json")
    assert r.status_code == 404 and r.json()["error"]["code"] == "fact_not_found"
    assert bob_client.delete(url).status_code == 404
    assert anon_client.get(url).status_code == 401
    # bob has no scope ["user", "alice"]: every read of it is a 404, as for updates,
    # journal and dreams (alice's scope of that name is not his)
    reads = [
        bob_client.get("/api/v1/engine/facts?scope=user&scope=alice"),
        bob_client.post("/api/v1/engine/search", {"scope": ["user", "alice"], "query": VIOLIN},
                        format="json"),
        bob_client.post("/api/v1/engine/injection", {"scope": ["user", "alice"], "max_tokens": 100},
                        format="json"),
        bob_client.get("/api/v1/engine/updates?scope=user&scope=alice"),
        bob_client.get("/api/v1/engine/journal?scope=user&scope=alice"),
        bob_client.get("/api/v1/engine/dreams?scope=user&scope=alice"),
    ]  # fmt: skip
    assert [(r.status_code, r.json()["error"]["code"]) for r in reads] == [
        (404, "scope_not_found")
    ] * 6
    assert not Scope.objects.filter(owner__username="bob").exists()  # reads created nothing
    v = Fact.objects.get(pk=fact["id"])
    assert (v.confidence, v.content) == (1.0, "User prefers dark mode")
    assert FactChange.objects.count() == 1


def test_templates_fill_from_values_and_header_missing_is_400(alice_client, fixture_embedder):
    r = _create(alice_client, ["memories", "{user_id}"], "User plays the violin")
    assert r.status_code == 400 and r.json()["error"]["code"] == "scope_value_missing"
    assert r.json()["error"]["details"]["missing"] == ["user_id"]
    assert Fact.objects.count() == 0
    r = _create(alice_client, ["memories", "{user_id}"], "User plays the violin",
                scope_values={"user_id": "u9"})  # fmt: skip
    assert r.status_code == 201
    r = alice_client.post(
        "/api/v1/engine/facts", {"scope": ["memories", "{user_id}"], "content": "User uses Bun"},
        format="json", HTTP_X_OPENWEBUI_USER_ID="u9",
    )  # fmt: skip
    assert r.status_code == 201
    listed = alice_client.get("/api/v1/engine/facts?scope=memories&scope=u9").json()["results"]
    assert sorted(f["content"] for f in listed) == ["User plays the violin", "User uses Bun"]


@pytest.mark.parametrize(
    "body",
    [
        {"scope": "user", "content": "x"},
        {"scope": [], "content": "x"},
        {"scope": ["user", "a b"], "content": "x"},
        {"scope": ["user", "u1"], "content": ""},
        {"scope": ["user", "u1"], "content": "x", "category": "opinion"},
        {"scope": ["user", "u1"], "content": "x", "confidence": 2},
    ],
)
def test_invalid_create_is_400_and_writes_nothing(alice_client, fixture_embedder, body):
    r = alice_client.post("/api/v1/engine/facts", body, format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] in ("invalid",)
    assert Fact.objects.count() == 0


def test_duplicate_and_below_threshold_answer_200(alice_client, fixture_embedder):
    _create(alice_client, ["user", "u1"], "User has a dog named Rex")
    r = _create(alice_client, ["user", "u1"], "User owns a dog called Rex")
    assert r.status_code == 200 and r.json()["decision"]["action"] == "duplicate"
    r = _create(alice_client, ["user", "u1"], "User uses Bun", confidence=0.5)
    assert r.status_code == 200 and r.json()["decision"]["action"] == "below_threshold"
    assert r.json()["fact"] is None and Fact.objects.count() == 1


def test_a_fact_below_the_threshold_makes_no_scope(alice_client, fixture_embedder):
    r = _create(alice_client, ["user", "u9"], "User uses Bun", confidence=0.5)
    assert r.status_code == 200 and r.json()["decision"]["action"] == "below_threshold"
    assert not Scope.objects.exists() and not Fact.objects.exists()
    assert alice_client.get("/api/v1/users/u9/memories").status_code == 404


def test_search_and_injection(alice_client, fixture_embedder):
    _create(
        alice_client, ["user", "u1"], "User plays the violin", category="behavior", confidence=0.9
    )
    _create(
        alice_client,
        ["user", "u1"],
        "User prefers dark mode",
        category="preference",
        confidence=0.95,
    )
    r = alice_client.post(
        "/api/v1/engine/search",
        {"scope": ["user", "u1"], "query": VIOLIN, "limit": 1},
        format="json",
    )
    assert r.status_code == 200 and r.json()["mode"] == "hybrid"
    assert [h["content"] for h in r.json()["results"]] == ["User plays the violin"]
    r = alice_client.post(
        "/api/v1/engine/search",
        {"scope": ["user", "u1"], "query": VIOLIN, "filter": {"category": "preference"}},
        format="json",
    )
    assert [h["content"] for h in r.json()["results"]] == ["User prefers dark mode"]
    r = alice_client.post("/api/v1/engine/injection", {"scope": ["user", "u1"], "max_tokens": 200},
                          format="json")  # fmt: skip
    assert r.status_code == 200
    assert r.json()["text"] == (
        "- [preference | 0.95] User prefers dark mode\n- [behavior | 0.90] User plays the violin"
    )
    assert r.json()["tokens"] > 0 and len(r.json()["facts"]) == 2
    r = alice_client.post("/api/v1/engine/injection", {"scope": ["user", "u1"], "max_tokens": 200,
                          "query": VIOLIN}, format="json")  # fmt: skip
    assert r.json()["text"].splitlines()[0] == "- [behavior | 0.90] User plays the violin"
    r = alice_client.post("/api/v1/engine/injection", {"scope": ["user", "u1"]}, format="json")
    assert r.status_code == 400


def test_an_edit_that_changes_nothing_writes_nothing(alice, alice_client):
    """Re-saving a fact unchanged kept a version, an audit row and a new observed_at (its
    decay restarted) each time; and an edit could make a fact say what another fact of
    its scope says, which an add refuses as a duplicate (a new user's audit)."""
    from memories.facts.models import FactVersion

    scope = ["p", "1"]
    coffee = _create(alice_client, scope, "Likes coffee", confidence=0.8).json()["fact"]
    _create(alice_client, scope, "Lives in Lisbon")
    url = f"/api/v1/engine/facts/{coffee['id']}"
    before = Fact.objects.get(pk=coffee["id"])
    counts = (FactVersion.objects.count(), FactChange.objects.count())
    for body in ({"content": "Likes coffee"}, {"confidence": 0.8},
                 {"content": "Likes coffee", "confidence": 0.8}):  # fmt: skip
        same = alice_client.patch(url, body, format="json")
        assert same.status_code == 200, same.content
        assert same.json()["content"] == "Likes coffee"
    after = Fact.objects.get(pk=coffee["id"])
    assert (FactVersion.objects.count(), FactChange.objects.count()) == counts
    assert (after.observed_at, after.recorded_at) == (before.observed_at, before.recorded_at)
    history = alice_client.get(f"{url}/history").json()
    assert [v["content"] for v in history["versions"]] == ["Likes coffee"]
    # Another fact's text: a 409, nothing changed.
    taken = alice_client.patch(url, {"content": "Lives in Lisbon"}, format="json")
    assert taken.status_code == 409, taken.content
    assert taken.json()["error"]["code"] == "duplicate_fact"
    assert Fact.objects.get(pk=coffee["id"]).content == "Likes coffee"
    assert (FactVersion.objects.count(), FactChange.objects.count()) == counts
    # A real change is one version and one audit row.
    changed = alice_client.patch(url, {"content": "Likes strong coffee"}, format="json")
    assert changed.status_code == 200, changed.content
    assert FactChange.objects.count() == counts[1] + 1


@pytest.mark.parametrize("given", [True, "0.9", None])
def test_a_confidence_is_a_json_number(alice, alice_client, given):
    """DRF's FloatField took true as 1.0 and "0.9" as 0.9 (a new user's audit)."""
    made = _create(alice_client, ["p", "1"], "Likes tea", confidence=given)
    assert made.status_code == 400, made.content
    assert "confidence" in made.json()["error"]["details"]
    added = alice_client.post("/api/v1/users/u1/memories",
                              {"text": "Likes tea", "infer": False, "confidence": given},
                              format="json")  # fmt: skip
    assert added.status_code == 400, added.content
    assert not Fact.objects.exists()
    fact = _create(alice_client, ["p", "1"], "Likes tea", confidence=0.9).json()["fact"]
    patched = alice_client.patch(f"/api/v1/engine/facts/{fact['id']}", {"confidence": given},
                                 format="json")  # fmt: skip
    assert patched.status_code == 400, patched.content
    assert Fact.objects.get().confidence == 0.9


def test_an_unknown_category_is_a_400_on_the_list_as_on_the_search(alice_client):
    _create(alice_client, ["p", "1"], "Likes tea", category="preference")
    listed = alice_client.get("/api/v1/engine/facts", {"scope": '["p", "1"]', "category": "nope"})
    assert listed.status_code == 400, listed.content
    assert listed.json()["error"]["message"].startswith("category: unknown nope")
    known = alice_client.get("/api/v1/engine/facts",
                             {"scope": '["p", "1"]', "category": "preference"})  # fmt: skip
    assert known.status_code == 200 and known.json()["count"] == 1
