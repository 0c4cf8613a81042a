"""Core facts: scopes, dedup, replacement, threshold, eviction, all audited."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.errors import InvalidInput
from memories.facts import search
from memories.facts.models import Fact, FactChange, FactLink, FactVersion, Scope
from memories.facts.scopes import ScopeValueMissing, end_user_ensure, scope_fill, scope_find
from memories.facts.selectors import FactNotFound, fact_list
from memories.facts.services import (
    FactIn,
    contradiction,
    fact_add,
    fact_delete,
    fact_share,
    fact_update,
)

pytestmark = pytest.mark.django_db


def _facts(owner, scope):
    row = scope_find(owner=owner, scope=scope)
    return [] if row is None else sorted(v.content for v in fact_list(scope=row))


def test_scope_templates_fill_and_a_missing_value_is_400():
    assert scope_fill(["memories", "{user_id}"], {"user_id": "u-1"}) == ("memories", "u-1")
    assert scope_fill(["org", "{org}", "agent-{agent}"], {"org": "acme", "agent": "a"}) == (
        "org", "acme", "agent-a",
    )  # fmt: skip
    with pytest.raises(ScopeValueMissing) as err:
        scope_fill(["memories", "{user_id}"], {})
    assert err.value.status_code == 400
    assert err.value.details["missing"] == ["user_id"]
    with pytest.raises(ScopeValueMissing):
        scope_fill(["memories", "{user_id}"], {"user_id": ""})
    for bad in ([], "user", ["user", ""], ["user", "a b"], ["x"] * 9, ["user", 3]):
        with pytest.raises(InvalidInput):
            scope_fill(bad, {})


def test_user_scope_is_the_end_user_of_personal_memories(alice, fixture_embedder):
    [decision] = fact_add(
        owner=alice, scope=("user", "alice"), facts=[FactIn("User plays the violin")]
    )
    assert decision.action == "add"
    end_user = end_user_ensure(owner=alice, external_id="alice")
    assert [v.content for v in fact_list(scope=end_user)] == ["User plays the violin"]
    assert Scope.objects.get(pk=end_user.pk).path == ["user", "alice"]
    # and the other way round: a personal memory is a fact of the user scope
    assert _facts(alice, ("user", "alice")) == ["User plays the violin"]


def test_scopes_isolate_inside_and_across_owners(alice, bob, fixture_embedder):
    fact_add(owner=alice, scope=("org", "acme", "a1"), facts=[FactIn("User uses Bun")])
    fact_add(owner=alice, scope=("org", "acme", "a2"), facts=[FactIn("User uses Node.js")])
    fact_add(owner=bob, scope=("org", "acme", "a1"), facts=[FactIn("User prefers dark mode")])
    assert _facts(alice, ("org", "acme", "a1")) == ["User uses Bun"]
    assert _facts(alice, ("org", "acme", "a2")) == ["User uses Node.js"]
    assert _facts(bob, ("org", "acme", "a1")) == ["User prefers dark mode"]
    bun = Fact.objects.get(content="User uses Bun")
    with pytest.raises(FactNotFound):
        fact_delete(owner=bob, fact_id=bun.pk)
    with pytest.raises(FactNotFound):
        fact_update(owner=bob, fact_id=bun.pk, confidence=0.1)
    with pytest.raises(FactNotFound):  # alice's fact, but not in that scope
        fact_delete(owner=alice, fact_id=bun.pk, scope=("org", "acme", "a2"))
    bun.refresh_from_db()
    assert bun.confidence == 1.0 and _facts(alice, ("org", "acme", "a1")) == ["User uses Bun"]


def test_exact_and_semantic_duplicates_write_nothing(alice, fixture_embedder):
    scope = ("user", "u1")
    fact_add(owner=alice, scope=scope, facts=[FactIn("User has a dog named Rex")])
    before = (Fact.objects.count(), FactChange.objects.count())
    decisions = fact_add(
        owner=alice,
        scope=scope,
        facts=[FactIn("  user has a dog named rex. "), FactIn("User owns a dog called Rex")],
    )
    assert [(d.action, d.match) for d in decisions] == [
        ("duplicate", "exact"), ("duplicate", "semantic"),
    ]  # fmt: skip
    assert decisions[1].similarity == pytest.approx(0.9039, abs=1e-3)
    assert (Fact.objects.count(), FactChange.objects.count()) == before
    # the exact duplicate was caught before embedding
    assert fixture_embedder.calls.count("  user has a dog named rex. ") == 0


def test_duplicates_inside_one_batch(alice, fixture_embedder):
    decisions = fact_add(
        owner=alice, scope=("user", "u1"),
        facts=[FactIn("User has a dog named Rex"), FactIn("User owns a dog called Rex")],
    )  # fmt: skip
    assert [d.action for d in decisions] == ["add", "duplicate"]
    assert _facts(alice, ("user", "u1")) == ["User has a dog named Rex"]


def test_contradiction_replacement_is_audited(alice, fixture_embedder):
    scope = ("user", "u1")
    [old] = fact_add(owner=alice, scope=scope, facts=[FactIn("User lives in New York")])
    [new] = fact_add(
        owner=alice, scope=scope, reason="user moved",
        facts=[FactIn("User moved to Los Angeles", replaces=old.fact_id, category="context")],
    )  # fmt: skip
    assert (new.action, new.target_id) == ("replace", old.fact_id)
    assert _facts(alice, scope) == ["User moved to Los Angeles"]
    assert not Fact.objects.filter(pk=old.fact_id).exists()  # nobody else linked it
    audit = FactChange.objects.get(action="replace")
    assert (str(audit.old_fact_id), str(audit.new_fact_id), audit.reason) == (
        old.fact_id, new.fact_id, "user moved",
    )  # fmt: skip
    assert (audit.old_content, audit.new_content) == (
        "User lives in New York", "User moved to Los Angeles",
    )  # fmt: skip


def test_the_opposite_of_a_memory_replaces_it_where_a_paraphrase_is_a_duplicate(
    alice, fixture_embedder
):
    """An embedder puts "User is not vegan" beside "User is vegan" (cosine 0.977, above the
    0.9 that makes a duplicate): refused as a duplicate, the correction was lost."""
    scope = ("user", "u1")
    [vegan] = fact_add(owner=alice, scope=scope, facts=[FactIn("User is vegan")])
    [dog] = fact_add(owner=alice, scope=scope, facts=[FactIn("User has a dog named Rex")])
    decisions = fact_add(
        owner=alice, scope=scope, reason="added through the API",
        facts=[FactIn("User is not vegan"), FactIn("User does not have a dog named Rex")],
    )  # fmt: skip
    assert [(d.action, d.target_id) for d in decisions] == [
        ("replace", vegan.fact_id), ("replace", dog.fact_id),
    ]  # fmt: skip
    assert decisions[0].reason == (
        "added through the API; says the opposite of a fact this near (similarity 0.98)"
    )
    assert _facts(alice, scope) == ["User does not have a dog named Rex", "User is not vegan"]
    audit = FactChange.objects.filter(action="replace").order_by("created_at")
    assert [(a.old_content, a.new_content) for a in audit] == [
        ("User is vegan", "User is not vegan"),
        ("User has a dog named Rex", "User does not have a dog named Rex"),
    ]
    # both negated: the same meaning, a duplicate; nothing written
    before = (Fact.objects.count(), FactChange.objects.count())
    [same] = fact_add(owner=alice, scope=scope, facts=[FactIn("User isn't vegan")])
    assert (same.action, same.match, same.fact_id) == (
        "duplicate", "semantic", decisions[0].fact_id,
    )  # fmt: skip
    # back again at the same confidence: the flip-flop guard keeps the newer fact
    [back] = fact_add(owner=alice, scope=scope, facts=[FactIn("User is vegan")])
    assert (back.action, back.fact_id) == ("flip_flop", decisions[0].fact_id)
    assert (Fact.objects.count(), FactChange.objects.count()) == before


@pytest.mark.parametrize(
    ("near", "new", "opposite"),
    [("User drinks coffee and tea", "User drinks neither coffee nor tea", True),
     ("User lives in Lisbon", "User no longer lives in Lisbon", True),
     ("User has two pets", "User has no pets", True),
     # one says more (a car), not the opposite: a duplicate, as any near fact
     ("User lives in Lisbon and does not own a car", "User lives in Lisbon", False),
     ("User is not vegan", "User isn't vegan", False)],
)  # fmt: skip
def test_what_says_the_opposite(near, new, opposite):
    """Negated on one side only, and little else different ("neither ... nor" is one
    negation, not two that cancel)."""
    said = contradiction(FactIn(new), near)
    assert (said == "says the opposite of a fact this near") is opposite
    assert opposite or said is None


def test_a_correction_replaces_the_memory_it_is_as_near_as_a_duplicate_to(alice, fixture_embedder):
    scope = ("user", "u1")
    [old] = fact_add(owner=alice, scope=scope, facts=[FactIn("User is 30 years old")])
    [same] = fact_add(owner=alice, scope=scope, facts=[FactIn("User is 31 years old")])
    assert (same.action, same.fact_id) == ("duplicate", old.fact_id)  # (cosine 0.966)
    assert _facts(alice, scope) == ["User is 30 years old"]
    [fixed] = fact_add(owner=alice, scope=scope, facts=[
        FactIn("User is 31 years old", category="correction", source_kind="message"),
    ])  # fmt: skip
    assert (fixed.action, fixed.target_id) == ("replace", old.fact_id)
    assert fixed.reason.endswith("a correction of a fact this near (similarity 0.97)")
    assert _facts(alice, scope) == ["User is 31 years old"]
    # a correction is no change of the world: the old version is retracted, not superseded
    version = FactVersion.objects.get(fact_id=old.fact_id)
    assert (version.action, version.superseded, version.valid_to) == ("replace", False, None)


def test_confidence_threshold(alice, fixture_embedder, settings):
    decisions = fact_add(
        owner=alice, scope=("user", "u1"),
        facts=[FactIn("User uses Bun", confidence=0.69), FactIn("User uses Node.js", confidence=0.7)],
    )  # fmt: skip
    assert [d.action for d in decisions] == ["below_threshold", "add"]
    assert _facts(alice, ("user", "u1")) == ["User uses Node.js"]
    assert "User uses Bun" not in fixture_embedder.calls  # not even embedded
    settings.ENGINE_MIN_CONFIDENCE = 0.2
    [d] = fact_add(
        owner=alice, scope=("user", "u1"), facts=[FactIn("User uses Bun", confidence=0.3)]
    )
    assert d.action == "add"


def test_invalid_input_writes_nothing(alice, fixture_embedder):
    for bad in (
        FactIn("User uses Bun", category="opinion"),
        FactIn("User uses Bun", confidence=1.5),
        FactIn("   "),
        FactIn("User uses Bun", source_kind="rumour"),
    ):
        with pytest.raises(InvalidInput):
            fact_add(
                owner=alice, scope=("user", "u1"), facts=[FactIn("User plays the violin"), bad]
            )
    assert Fact.objects.count() == 0 and Scope.objects.count() == 0


def test_max_facts_evicts_lowest_confidence_then_oldest_audited(alice, fixture_embedder):
    scope = ("user", "u1")
    old = timezone.now() - timedelta(days=3)
    fact_add(
        owner=alice, scope=scope, max_facts=3,
        facts=[
            FactIn("User uses Bun", confidence=0.8, observed_at=old),
            FactIn("User prefers dark mode", confidence=0.8),
            FactIn("User plays the violin", confidence=0.95),
        ],
    )  # fmt: skip
    decisions = fact_add(
        owner=alice, scope=scope, max_facts=3, reason="extraction",
        facts=[FactIn("User works as a nurse", confidence=0.9), FactIn("User is allergic to peanuts", confidence=0.75)],
    )  # fmt: skip
    # 5 facts for 3 places: the 0.75 one (just added) and the oldest 0.8 one go
    assert [d.action for d in decisions] == ["add", "evicted"]
    assert _facts(alice, scope) == [
        "User plays the violin", "User prefers dark mode", "User works as a nurse",
    ]  # fmt: skip
    evictions = FactChange.objects.filter(action="evict").order_by("old_content")
    assert [(e.old_content, e.reason) for e in evictions] == [
        ("User is allergic to peanuts", "max_facts 3 reached (extraction)"),
        ("User uses Bun", "max_facts 3 reached (extraction)"),
    ]
    assert sorted(decisions[-1].evicted_ids) == sorted(str(e.old_fact_id) for e in evictions)


def test_update_and_delete_are_audited(alice, fixture_embedder):
    [d] = fact_add(owner=alice, scope=("org", "acme"), facts=[FactIn("User uses Bun")])
    fact = fact_update(owner=alice, fact_id=d.fact_id, confidence=0.8, category="preference")
    assert (fact.confidence, fact.category, fact.content) == (0.8, "preference", "User uses Bun")
    fact = fact_update(owner=alice, fact_id=d.fact_id, content="User uses Node.js")
    assert fact.content == "User uses Node.js" and fact.normalized == "user uses node.js"
    fact_delete(owner=alice, fact_id=d.fact_id, reason="user asked")
    assert _facts(alice, ("org", "acme")) == []
    assert list(FactChange.objects.order_by("created_at").values_list("action", flat=True)) == [
        "add", "update", "update", "delete",
    ]  # fmt: skip


def test_shared_fact_is_found_from_both_scopes_and_copied_on_write(alice, fixture_embedder):
    [d] = fact_add(owner=alice, scope=("user", "u1"), facts=[FactIn("User uses Bun")])
    u2 = end_user_ensure(owner=alice, external_id="u2")
    bun = Fact.objects.get(pk=d.fact_id)
    fact_share(scope=u2, fact=bun)
    bun.refresh_from_db()
    assert bun.scope_id is None and set(FactLink.objects.values_list("shared", flat=True)) == {True}
    assert _facts(alice, ("user", "u2")) == ["User uses Bun"]
    # an exact duplicate in u2 is found through the shared link
    [dup] = fact_add(owner=alice, scope=("user", "u2"), facts=[FactIn("user uses bun")])
    assert (dup.action, dup.fact_id) == ("duplicate", d.fact_id)
    with pytest.raises(InvalidInput) as err:  # which scope? say it
        fact_update(owner=alice, fact_id=d.fact_id, confidence=0.8)
    assert err.value.code == "scope_required"
    new = fact_update(owner=alice, fact_id=d.fact_id, scope=("user", "u2"), confidence=0.8)
    assert str(new.pk) != d.fact_id and new.scope_id == u2.pk
    assert Fact.objects.get(pk=d.fact_id).confidence == 1.0


def test_a_large_scope_finds_semantic_duplicates_through_the_hnsw_index(
    alice, fixture_embedder, monkeypatch
):
    """Beyond the facts' exact_max the duplicate check walks the HNSW index of the
    dimension, filtered to the scope (adds stay flat as the scope grows): same answer."""
    monkeypatch.setattr(search, "FACTS", replace(search.FACTS, exact_max=2))
    scope = ("user", "u1")
    facts = ["User has a dog named Rex", "User plays the violin", "User works as a nurse"]
    fact_add(owner=alice, scope=scope, facts=[FactIn(f) for f in facts])
    # Another scope's nearer copy is not this scope's duplicate.
    fact_add(owner=alice, scope=("user", "u2"), facts=[FactIn("User owns a dog called Rex")])
    before = (Fact.objects.count(), FactChange.objects.count())
    with CaptureQueriesContext(connection) as queries:
        [decision] = fact_add(
            owner=alice, scope=scope, facts=[FactIn("User owns a dog called Rex")]
        )
    assert (decision.action, decision.match) == ("duplicate", "semantic")
    assert decision.similarity == pytest.approx(0.9039, abs=1e-3)
    assert (Fact.objects.count(), FactChange.objects.count()) == before
    nearest = [q["sql"] for q in queries.captured_queries if "::halfvec(384)" in q["sql"]]
    assert len(nearest) == 1  # the walk (which plan it gets at scale: BENCHMARKS.md)
    # A new fact of the large scope is added as usual.
    [added] = fact_add(owner=alice, scope=scope, facts=[FactIn("User prefers dark mode")])
    assert added.action == "add"


def test_flip_flop_replacements_keep_the_newer_fact_unless_more_confident(alice, fixture_embedder):
    """A -> B -> A from noisy extraction: the replacement back to A is refused (the
    newer B stays) unless A comes with a higher confidence than B has."""
    scope = ("user", "u1")
    [a] = fact_add(owner=alice, scope=scope, facts=[FactIn("User uses Bun", confidence=0.8)])
    [b] = fact_add(
        owner=alice, scope=scope,
        facts=[FactIn("User uses Node.js", confidence=0.8, replaces=a.fact_id)],
    )  # fmt: skip
    assert b.action == "replace"
    before = (
        list(Fact.objects.values_list("id", "content")),
        FactChange.objects.count(),
    )
    # Back to A at the same confidence: refused, nothing written.
    [back] = fact_add(
        owner=alice, scope=scope,
        facts=[FactIn("User uses Bun", confidence=0.8, replaces=b.fact_id)],
    )  # fmt: skip
    assert (back.action, back.fact_id) == ("flip_flop", b.fact_id)
    assert "kept the newer fact" in back.reason
    assert (
        list(Fact.objects.values_list("id", "content")),
        FactChange.objects.count(),
    ) == before
    assert _facts(alice, scope) == ["User uses Node.js"]
    # Stated with more conviction than B has: applied.
    [again] = fact_add(
        owner=alice, scope=scope,
        facts=[FactIn("User uses Bun", confidence=0.95, replaces=b.fact_id)],
    )  # fmt: skip
    assert again.action == "replace" and _facts(alice, scope) == ["User uses Bun"]
    # A replacement to a text never replaced here is not a flip-flop.
    [other] = fact_add(
        owner=alice, scope=scope,
        facts=[FactIn("User likes TypeScript", confidence=0.8, replaces=again.fact_id)],
    )  # fmt: skip
    assert other.action == "replace"


def test_flip_flop_guard_looks_back_a_window_of_replacements(alice, fixture_embedder, settings):
    settings.ENGINE_FLIP_FLOP_WINDOW = 1
    scope = ("user", "u1")
    [a] = fact_add(owner=alice, scope=scope, facts=[FactIn("User uses Bun", confidence=0.8)])
    [b] = fact_add(
        owner=alice, scope=scope,
        facts=[FactIn("User uses Node.js", confidence=0.8, replaces=a.fact_id)],
    )  # fmt: skip
    # Another replacement of the scope since: B -> A is outside the window of 1.
    [x] = fact_add(owner=alice, scope=scope, facts=[FactIn("User likes JavaScript")])
    fact_add(
        owner=alice, scope=scope,
        facts=[FactIn("User likes TypeScript", replaces=x.fact_id)],
    )  # fmt: skip
    [back] = fact_add(
        owner=alice, scope=scope,
        facts=[FactIn("User uses Bun", confidence=0.8, replaces=b.fact_id)],
    )  # fmt: skip
    assert back.action == "replace"
    assert _facts(alice, scope) == ["User likes TypeScript", "User uses Bun"]
