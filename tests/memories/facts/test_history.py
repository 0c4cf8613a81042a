"""Facts keep their history (issue 27): every change closes the version it replaces into
``FactVersion``; reads take ``as_of`` (what the service believed then) and ``valid_at``
(what was true in the world then) at every door; a fact's history lists its versions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from memories.engine.facade import MemoryEngine
from memories.facts.models import Fact, FactLink, FactVersion, Scope
from memories.facts.scopes import end_user_ensure
from memories.facts.services import FactIn, fact_add, fact_delete, fact_update, scope_erase
from memories.tools.registry import ToolError, tool_call
from tests.memories.engine.scripted import engine_storage  # noqa: F401

pytestmark = pytest.mark.django_db
BASE = "/api/v1/users/u1/memories"
ERR = {"code", "message", "details"}


def _iso(when) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _add(owner, text, scope=("user", "u1"), **fields):
    [decision] = fact_add(owner=owner, scope=list(scope), facts=[FactIn(text, **fields)],
                          dedup_threshold=1.01)  # fmt: skip
    return decision


def _contents(response) -> list[str]:
    return [f["content"] for f in response.json()["results"]]


def test_an_edit_keeps_the_old_version_and_reads_as_of_see_it(alice, alice_client):
    first = _add(alice, "User drinks black coffee")
    before_edit = timezone.now()
    response = alice_client.patch(f"{BASE}/{first.fact_id}", {"content": "User drinks green tea",
                                  "reason": "the user said so"}, format="json")  # fmt: skip
    assert response.status_code == 200
    after_edit = timezone.now()
    # One current fact, the same id; its old text is a closed version.
    assert [(str(f.pk), f.content) for f in Fact.objects.all()] == [
        (first.fact_id, "User drinks green tea")
    ]
    [version] = FactVersion.objects.all()
    assert (str(version.fact_id), version.content, version.action, version.reason) == (
        first.fact_id, "User drinks black coffee", "update", "the user said so",
    )  # fmt: skip
    assert version.source == {"kind": "api"} and str(version.successor_id) == first.fact_id
    assert version.recorded_to <= after_edit and version.recorded_to >= before_edit
    assert not version.superseded
    # Current by default; as of before the edit, the old text, at every door.
    assert _contents(alice_client.get(BASE)) == ["User drinks green tea"]
    listed = alice_client.get(BASE, {"as_of": _iso(before_edit)})
    assert _contents(listed) == ["User drinks black coffee"]
    assert listed.json()["results"][0]["recorded_to"] is not None
    engine = alice_client.get("/api/v1/engine/facts", {"scope": ["user", "u1"],
                              "as_of": _iso(before_edit)})  # fmt: skip
    assert _contents(engine) == ["User drinks black coffee"]
    searched = alice_client.post(f"{BASE}/search", {"query": "what does the user drink",
                                 "as_of": _iso(before_edit)}, format="json")  # fmt: skip
    assert _contents(searched) == ["User drinks black coffee"]
    assert searched.json()["results"][0]["id"] == first.fact_id
    now = alice_client.post("/api/v1/engine/search", {"scope": ["user", "u1"],
                            "query": "what does the user drink"}, format="json")  # fmt: skip
    assert _contents(now) == ["User drinks green tea"]
    injected = alice_client.post("/api/v1/engine/injection", {"scope": ["user", "u1"],
                                 "max_tokens": 200, "as_of": _iso(before_edit)},
                                 format="json").json()  # fmt: skip
    assert injected["text"] == "- [context | 1.00] User drinks black coffee"
    assert injected["facts"] == [first.fact_id]
    # The history, at both doors: the old version then the current one.
    for url in (f"{BASE}/{first.fact_id}/history", f"/api/v1/engine/facts/{first.fact_id}/history"):
        history = alice_client.get(url).json()
        assert [(v["content"], v["closed_by"] and v["closed_by"]["action"])
                for v in history["versions"]] == [
            ("User drinks black coffee", "update"), ("User drinks green tea", None),
        ]  # fmt: skip
        assert history["versions"][0]["closed_by"]["source"] == {"kind": "api"}
        assert [r["action"] for r in history["results"]] == ["add", "update"]


def test_a_move_learned_from_a_conversation_is_true_until_it_happened(alice, alice_client):
    lisbon = _add(alice, "User lives in Lisbon", source_kind="message")
    march = timezone.now().replace(year=2026, month=3, day=1, hour=0, minute=0, second=0,
                                   microsecond=0)  # fmt: skip
    porto = _add(alice, "User lives in Porto", source_kind="message", replaces=lisbon.fact_id,
                 valid_from=march)  # fmt: skip
    assert porto.action == "replace"
    [version] = FactVersion.objects.all()
    assert (version.superseded, version.valid_to, str(version.successor_id)) == (
        True, march, porto.fact_id,
    )  # fmt: skip
    # Current facts: Porto only. True in February: Lisbon; in April: Porto.
    assert _contents(alice_client.get(BASE)) == ["User lives in Porto"]
    feb = _contents(alice_client.get(BASE, {"valid_at": "2026-02-10"}))
    april = _contents(alice_client.get(BASE, {"valid_at": "2026-04-10T12:00:00Z"}))
    assert (feb, april) == (["User lives in Lisbon"], ["User lives in Porto"])
    found = alice_client.post("/api/v1/engine/search", {"scope": ["user", "u1"],
                              "query": "where does the user live", "valid_at": "2026-02-10"},
                              format="json").json()  # fmt: skip
    assert [h["content"] for h in found["results"]] == ["User lives in Lisbon"]
    assert found["results"][0]["valid_to"] == "2026-03-01T00:00:00Z"
    # Either id gives the whole lineage: its versions and its audit rows (the newest id
    # gave only its own audit row).
    fact_update(owner=alice, fact_id=porto.fact_id, content="User lives in Porto, Portugal")
    for fact_id in (lisbon.fact_id, porto.fact_id):
        history = alice_client.get(f"/api/v1/engine/facts/{fact_id}/history").json()
        assert [(v["id"], v["content"]) for v in history["versions"]] == [
            (lisbon.fact_id, "User lives in Lisbon"), (porto.fact_id, "User lives in Porto"),
            (porto.fact_id, "User lives in Porto, Portugal"),
        ]  # fmt: skip
        assert [r["action"] for r in history["results"]] == ["add", "replace", "update"]


def test_a_correction_retracts_the_old_version(alice, alice_client):
    wrong = _add(alice, "User's name is Jon", source_kind="message")
    _add(alice, "User's name is John", source_kind="message", category="correction",
         replaces=wrong.fact_id)  # fmt: skip
    [version] = FactVersion.objects.all()
    assert (version.superseded, version.valid_to) == (False, None)
    # A retracted version is nobody's past truth: valid_at never shows it.
    assert _contents(alice_client.get(BASE, {"valid_at": "2020-01-01"})) == ["User's name is John"]


def test_deletes_and_evictions_keep_the_last_version(alice, alice_client):
    doomed = _add(alice, "User collects stamps")
    before = timezone.now()
    fact_delete(owner=alice, fact_id=doomed.fact_id, reason="wrong", source={"kind": "admin"})
    assert not Fact.objects.exists()
    [gone] = FactVersion.objects.all()
    assert (gone.action, gone.successor_id, gone.source) == ("delete", None, {"kind": "admin"})
    assert _contents(alice_client.get(BASE, {"as_of": _iso(before)})) == ["User collects stamps"]
    assert alice_client.get(BASE, {"as_of": _iso(timezone.now())}).json()["count"] == 0
    # The deleted fact's history is still read at the engine's door (its scope is found).
    history = alice_client.get(f"/api/v1/engine/facts/{doomed.fact_id}/history").json()
    assert [v["closed_by"]["action"] for v in history["versions"]] == ["delete"]
    # Eviction: the trimmed fact is a closed version too.
    fact_add(owner=alice, scope=["user", "u2"], facts=[FactIn("User likes chess", confidence=0.8)])
    fact_add(owner=alice, scope=["user", "u2"], facts=[FactIn("User likes go")], max_facts=1)
    evicted = FactVersion.objects.get(action="evict")
    assert evicted.content == "User likes chess" and "max_facts 1" in evicted.reason


def test_duplicate_checks_compare_current_facts_only(alice):
    first = _add(alice, "User uses vim")
    fact_update(owner=alice, fact_id=first.fact_id, content="User uses emacs")
    again = _add(alice, "User uses vim")
    assert again.action == "add"
    assert sorted(Fact.objects.values_list("content", flat=True)) == [
        "User uses emacs", "User uses vim",
    ]  # fmt: skip


def test_the_search_tool_reads_as_of(alice):
    first = _add(alice, "User works at Acme")
    before = timezone.now()
    fact_update(owner=alice, fact_id=first.fact_id, content="User works at Globex")
    scope = ["user", "u1"]
    query = "where does the user work"
    now = tool_call(owner=alice, name="search_memory", arguments={"query": query}, scope=scope)
    then = tool_call(owner=alice, name="search_memory", scope=scope,
                     arguments={"query": query, "as_of": _iso(before)})  # fmt: skip
    assert [h["content"] for h in now["results"]] == ["User works at Globex"]
    assert [h["content"] for h in then["results"]] == ["User works at Acme"]
    with pytest.raises(ToolError) as error:
        tool_call(owner=alice, name="search_memory", scope=scope,
                  arguments={"query": query, "as_of": "2999-01-01"})  # fmt: skip
    assert error.value.status_code == 400 and "as_of" in error.value.details
    assert error.value.code == "invalid_arguments"  # as every bad argument (it said invalid)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"as_of": "yesterday-ish"}, "as_of"),
        ({"as_of": "2999-01-01"}, "as_of"),
        ({"valid_at": "1899-12-31"}, "valid_at"),
        ({"valid_at": "not a date"}, "valid_at"),
    ],
)
def test_bad_times_are_a_400_naming_the_field(alice, alice_client, params, field):
    _add(alice, "User reads novels")
    for response in (
        alice_client.get(BASE, params),
        alice_client.get("/api/v1/engine/facts", {"scope": ["user", "u1"], **params}),
        alice_client.post(f"{BASE}/search", {"query": "novels", **params}, format="json"),
        alice_client.post(
            "/api/v1/engine/search",
            {"scope": ["user", "u1"], "query": "novels", **params},
            format="json",
        ),  # fmt: skip
        alice_client.post(
            "/api/v1/engine/injection",
            {"scope": ["user", "u1"], "max_tokens": 100, **params},
            format="json",
        ),  # fmt: skip
    ):
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert set(error) == ERR and field in error["details"]


def test_a_bad_validity_writes_nothing(alice, alice_client):
    facts = {"scope": ["user", "u1"], "content": "User lived in Rome"}
    for body, field in (
        ({"valid_from": "2020-01-01", "valid_to": "2019-01-01"}, "valid_to"),
        ({"valid_from": "1850-01-01"}, "valid_from"),
        ({"valid_to": "someday"}, "valid_to"),
    ):
        response = alice_client.post("/api/v1/engine/facts", {**facts, **body}, format="json")
        assert response.status_code == 400 and field in response.json()["error"]["details"]
    assert not Fact.objects.exists() and not Scope.objects.exists()
    made = alice_client.post("/api/v1/engine/facts", {**facts, "valid_from": "2019-05-01",
                             "valid_to": "2021-06-30"}, format="json")  # fmt: skip
    assert made.status_code == 201
    fact = made.json()["fact"]
    assert (fact["valid_from"], fact["valid_to"]) == (
        "2019-05-01T00:00:00Z",
        "2021-06-30T00:00:00Z",
    )
    bad = alice_client.patch(f"/api/v1/engine/facts/{fact['id']}", {"valid_to": "2018-01-01"},
                             format="json")  # fmt: skip
    assert bad.status_code == 400 and "valid_to" in bad.json()["error"]["details"]
    assert not FactVersion.objects.exists()
    assert Fact.objects.get().valid_to.year == 2021


def test_erasure_removes_the_versions(alice, bob):
    first = _add(alice, "User owns a red bike")
    fact_update(owner=alice, fact_id=first.fact_id, content="User owns a blue bike")
    kept = _add(bob, "User owns a green bike")
    fact_update(owner=bob, fact_id=kept.fact_id, content="User owns a yellow bike")
    scope_erase(scope=end_user_ensure(owner=alice, external_id="u1"))
    assert list(FactVersion.objects.values_list("content", flat=True)) == ["User owns a green bike"]
    assert FactLink.objects.count() == 1


def test_another_owners_history_is_a_404(alice, bob_client):
    first = _add(alice, "User speaks Basque")
    fact_update(owner=alice, fact_id=first.fact_id, content="User speaks Basque and Catalan")
    response = bob_client.get(f"/api/v1/engine/facts/{first.fact_id}/history")
    assert response.status_code == 404
    assert FactVersion.objects.count() == 1


def test_as_of_a_time_before_any_fact_finds_nothing(alice, alice_client):
    long_ago = timezone.now() - timedelta(days=1)
    _add(alice, "User plays chess")
    assert alice_client.get(BASE, {"as_of": _iso(long_ago)}).json()["count"] == 0
    engine = MemoryEngine(owner=alice)
    from memories.facts.timeline import At

    found = engine.search(["user", "u1"], "chess", at=At(as_of=long_ago))
    assert found.hits == []


def test_the_admin_shows_a_facts_earlier_versions(alice, admin_client):
    first = _add(alice, "User rides a scooter")
    fact_update(owner=alice, fact_id=first.fact_id, content="User rides a motorbike",
                reason="upgraded", source={"kind": "admin", "user": "root"})  # fmt: skip
    end_user = Scope.objects.get(external_id="u1")
    page = admin_client.get(f"/admin/memories/scope/{end_user.pk}/change/").content.decode()
    link = f"/admin/memories/factversion/?q={first.fact_id}"
    assert "User rides a motorbike" in page and link in page
    versions = admin_client.get(link).content.decode()
    assert "User rides a scooter" in versions and "upgraded" in versions
    assert "admin root" in versions and "User rides a motorbike" not in versions
    version = FactVersion.objects.get()
    # Read only: no change, no delete.
    assert admin_client.post(f"/admin/memories/factversion/{version.pk}/delete/",
                             {"post": "yes"}).status_code == 403  # fmt: skip
    assert FactVersion.objects.filter(pk=version.pk).exists()


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("2026-03-01", "2026-03-01T00:00:00+00:00"),
        ("2026-03-01T09:30:00+01:00", "2026-03-01T08:30:00+00:00"),
        (None, None),
        ("", None),
        ("in March", None),  # unreadable: the fact is kept without it
        ("1850-01-01", None),  # before 1900: not a time the service keeps
    ],
)
def test_extraction_reads_when_a_fact_became_true(written, read):
    from ingestion.updates import parse_extraction

    item = {"content": "User lives in Porto", "category": "context", "confidence": 0.9,
            "valid_from": written}  # fmt: skip
    [fact] = parse_extraction({"newFacts": [item], "factsToRemove": []}, set()).facts
    assert (fact.valid_from.isoformat() if fact.valid_from else None) == read


def test_a_replacement_said_before_the_fact_it_replaces_leaves_no_inverted_interval(alice):
    """A backfilled conversation (its facts observed when they were said) can replace a
    fact valid from a later day: the closed version ended before it began, and no
    ``valid_at`` ever found it. It now ends where it began."""
    march = timezone.now().replace(year=2026, month=3, day=1, hour=0, minute=0, second=0,
                                   microsecond=0)  # fmt: skip
    lisbon = _add(alice, "User lives in Lisbon", source_kind="message", valid_from=march)
    porto = _add(alice, "User lives in Porto", source_kind="message", replaces=lisbon.fact_id,
                 observed_at=march.replace(year=2024))  # fmt: skip
    assert porto.action == "replace"
    [version] = FactVersion.objects.all()
    assert (version.valid_from, version.valid_to) == (march, march)
