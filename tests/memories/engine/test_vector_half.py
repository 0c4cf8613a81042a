"""The 16-bit copies of scoped facts' vectors (``memories_fact_half``, migration 0008):
kept by the database on every write, and the exact ranking read through them equal to
an exact scan of the 32-bit vectors, near ties and long bands included; facts of 768
and 1,536 dimensions stored and ranked (the old covering index could not hold them)."""

from __future__ import annotations

import hashlib
import importlib
import json
import uuid
from datetime import timedelta

import numpy as np
import pytest
from django.db import connection
from django.utils import timezone

from core.db_backend.base import table_owner
from knowledge.retrieval.db import fetch
from knowledge.retrieval.vectors import COPY_MARGIN as HALF_MARGIN
from memories.facts.models import Fact, FactLink, Scope
from memories.facts.scopes import scope_ensure, scope_find
from memories.facts.search import FACTS, FactFilter, fact_search, fact_vector_leg
from memories.facts.services import (
    FactIn,
    fact_add,
    fact_delete,
    fact_share,
    fact_update,
    scope_erase,
)
from tests.half_copies import copies_of, copies_out_of_sync
from tests.memories.engine.test_search_statement import exact_vector_ranking, reference_search
from tests.memories.facts.old_schema import old_schema

pytestmark = pytest.mark.django_db
HALF_MAX_DIMENSIONS = FACTS.copies_max_dims


def scope_vector_ranking(*, scope_id, vector, embedding_model, limit, filter=None):
    """[(fact id, similarity)] of the scope's vector leg run alone (exact: a small scope)."""
    row = Scope.objects.get(pk=scope_id)
    rows = fact_vector_leg(row, [float(x) for x in vector], embedding_model, limit, filter).run()
    assert not any(r[2] for r in rows)  # no walk
    return [(r[0], 1.0 - float(r[1])) for r in rows]


COPIED = "scope_id, id, dimensions, embedding_model, observed_at, confidence, category"
TOPICS = ["tea", "chess", "sailing", "piano", "rust"]


class Dims:
    """Deterministic random unit vectors of ``n`` dimensions for any text."""

    provider = "seeded"

    def __init__(self, n: int):
        self.dimensions, self.model = n, f"seeded-{n}"

    def embed(self, texts):
        out = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
            v = np.random.default_rng(seed).standard_normal(self.dimensions)
            out.append(v / np.linalg.norm(v))
        return np.asarray(out, dtype=np.float32)


def add_facts(owner, scope: tuple[str, ...], count: int, dims: int = 384) -> None:
    """``count`` facts "alice fact <i>" in ``scope``, embedded in ``dims`` dimensions."""
    facts = [FactIn(f"alice fact {i}") for i in range(count)]
    fact_add(owner=owner, scope=scope, facts=facts, embedder=Dims(dims))


def out_of_sync() -> list[tuple]:
    """Rows where the copy differs from what the facts say it must hold (both ways)."""
    where = f"scope_id IS NOT NULL AND dimensions <= {HALF_MAX_DIMENSIONS}"
    return copies_out_of_sync(
        table="memories_fact", copies="memories_fact_half", columns=COPIED, where=where
    )


def copies(scope: Scope) -> dict[uuid.UUID, tuple]:
    return copies_of("memories_fact_half", "xmin::text, confidence, category", "scope_id", scope.pk)


def test_the_copy_follows_every_write(alice):
    e384, e768, e1536 = Dims(384), Dims(768), Dims(1536)
    a = [FactIn(f"alice likes {t}", confidence=0.9) for t in TOPICS]
    fact_add(owner=alice, scope=("org", "a"), facts=a, embedder=e384)
    fact_add(owner=alice, scope=("org", "b"), facts=a[:2], embedder=e768)
    fact_add(owner=alice, scope=("org", "c"), facts=a[:2], embedder=e1536)
    sa, sb, sc = (scope_find(owner=alice, scope=("org", x)) for x in "abc")
    assert out_of_sync() == []
    assert (len(copies(sa)), len(copies(sb)), len(copies(sc))) == (5, 2, 0)  # 1536: no copy
    facts = {f.content: f for f in Fact.objects.filter(scope=sa)}

    # An edit of the text (re-embedded) replaces the copy; of the confidence, too.
    tea = facts["alice likes tea"]
    before = copies(sa)
    fact_update(owner=alice, fact_id=tea.pk, content="alice loves green tea")
    fact_update(owner=alice, fact_id=facts["alice likes chess"].pk, confidence=0.75)
    assert out_of_sync() == []
    after = copies(sa)
    assert after[facts["alice likes chess"].pk][1:] == (0.75, "context")
    # ... and a write that changes nothing copied (updated_at) leaves the copy as it was.
    piano = facts["alice likes piano"].pk
    Fact.objects.filter(pk=piano).update(updated_at=timezone.now() + timedelta(days=1))
    assert copies(sa)[piano] == before[piano]

    # Shared with another scope: no scope of its own, so no copy (read through links).
    sailing = facts["alice likes sailing"]
    fact_share(scope=sb, fact=sailing)
    assert Fact.objects.get(pk=sailing.pk).scope_id is None
    assert sailing.pk not in copies(sa) and out_of_sync() == []

    # Deleted, bulk-created, erased with its scope.
    fact_delete(owner=alice, fact_id=facts["alice likes rust"].pk)
    assert facts["alice likes rust"].pk not in copies(sa)
    vectors = e384.embed(["one", "two"])
    made = Fact.objects.bulk_create(
        [
            Fact(owner=alice, content=t, normalized=t, embedding=v.tolist(),
                   embedding_model=e384.model, dimensions=384, observed_at=timezone.now(),
                   scope=sa, category="goal", confidence=0.8)
            for t, v in zip(["one", "two"], vectors, strict=True)
        ]
    )  # fmt: skip
    FactLink.objects.bulk_create([FactLink(scope=sa, fact=v) for v in made])
    assert {v.pk for v in made} <= set(copies(sa)) and out_of_sync() == []
    scope_erase(scope=sa)
    assert copies(sa) == {} and out_of_sync() == []
    assert len(copies(sb)) == 2


@pytest.mark.django_db(transaction=True)
def test_a_truncate_of_the_facts_empties_the_copy(alice):
    fact_add(owner=alice, scope=("org", "a"), facts=[FactIn("alice likes tea")],
                  embedder=Dims(384))  # fmt: skip
    with table_owner(connection), connection.cursor() as cur:  # (TRUNCATE: the owner's)
        cur.execute("SELECT count(*) FROM memories_fact_half")
        assert cur.fetchone()[0] == 1
        cur.execute("TRUNCATE memories_fact CASCADE")
        cur.execute("SELECT count(*) FROM memories_fact_half")
        assert cur.fetchone()[0] == 0


def exact(scope: Scope, q: np.ndarray, model: str, limit: int, filter=None) -> list:
    """The reference: the plain exact scan of the table."""
    return exact_vector_ranking(scope_id=scope.pk, vector=q, embedding_model=model,
                                limit=limit, filter=filter)  # fmt: skip


def by_copy(scope: Scope, q: np.ndarray, limit: int) -> list:
    """The order of the 16-bit copies alone (what the margin must correct)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id FROM memories_fact_half WHERE scope_id = %s "
            "ORDER BY half <=> l2_normalize(%s::vector)::halfvec, id LIMIT %s",
            [scope.pk, q.tolist(), limit],
        )
        return [row[0] for row in cur.fetchall()]


def write(owner, name: str, vectors: np.ndarray) -> Scope:
    """A scope holding these vectors as facts ("<name> <i> ..." said i % 97 days ago,
    some sharing a word), written in bulk (as a COPY would: no duplicate check)."""
    scope = scope_ensure(owner=owner, scope=("crowd", name))
    now = timezone.now()
    rows = [
        Fact(owner=owner, content=f"{name} {i} {TOPICS[i % 5]}", normalized=f"{name} {i}",
               embedding=v.astype(np.float32).tolist(), embedding_model="crowd",
               dimensions=len(v), scope=scope, observed_at=now - timedelta(days=i % 97),
               category=["goal", "context"][i % 2], confidence=0.7 + (i % 4) * 0.1)
        for i, v in enumerate(vectors)
    ]  # fmt: skip
    Fact.objects.bulk_create(rows)
    FactLink.objects.bulk_create([FactLink(scope=scope, fact=v) for v in rows])
    return scope


def crowd(owner, name: str, base: np.ndarray, spread: float, count: int, seed: int) -> Scope:
    """``count`` facts around ``base``, ``spread`` away in random directions."""
    rng = np.random.default_rng(seed)
    vectors = base + spread * rng.standard_normal((count, len(base)))
    return write(owner, name, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))


def ring(owner, name: str, base: np.ndarray, distances: np.ndarray, seed: int) -> Scope:
    """Facts at these cosine distances from ``base``, in random directions."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((len(distances), len(base)))
    u -= np.outer(u @ base, base)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    c = 1.0 - distances
    return write(owner, name, c[:, None] * base + np.sqrt(1.0 - c * c)[:, None] * u)


def rescanned(scope: Scope, q: np.ndarray, limit: int) -> bool:
    """Whether the scope's vector leg for ``q`` reads its copies a second time (the band
    ran past the candidates kept): EXPLAIN ANALYZE of the leg's statement."""
    leg = fact_vector_leg(scope, [float(x) for x in q], "crowd", limit)
    assert "hv AS" in leg.sql
    [(plan,)], _ = fetch("EXPLAIN (ANALYZE, FORMAT JSON) " + leg.sql, leg.params, prepare=False)
    plan = json.loads(plan) if isinstance(plan, str) else plan
    scans = []

    def walk(node):
        if node.get("Relation Name") == "memories_fact_half":
            scans.append(node["Actual Loops"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    assert len(scans) == 2, scans
    return scans[1] > 0


def test_ranking_through_the_copies_is_the_exact_ranking(alice):
    """60 facts 0.000003 apart in distance to the query (a 16-bit copy is off by up to
    0.00003 here): the copies rank them otherwise, the ranking read through them is the
    exact one. And 2,000 facts in random directions, filtered or not."""
    rng = np.random.default_rng(5)
    base = rng.standard_normal(384)
    base /= np.linalg.norm(base)
    scope = ring(alice, "ring", base, 0.3 + 3e-6 * rng.permutation(60), seed=1)
    q = base.astype(np.float32)
    differs = 0
    for limit in (1, 5, 10, 20, 30, 60, 70):
        want = exact(scope, q, "crowd", limit)
        got = scope_vector_ranking(scope_id=scope.pk, vector=q, embedding_model="crowd",
                                   limit=limit)  # fmt: skip
        assert got == want, limit
        differs += set(by_copy(scope, q, limit)) != {pk for pk, _ in want}
    assert differs >= 3  # (the copies alone pick other facts: the margin does the work)
    assert len(got) == 60
    spread = crowd(alice, "spread", base, 1.0, 2000, seed=2)
    goals = FactFilter(categories=["goal"], min_confidence=0.8)
    for _ in range(5):
        q = rng.standard_normal(384).astype(np.float32)
        for limit in (1, 10, 50):
            got = scope_vector_ranking(scope_id=spread.pk, vector=q, embedding_model="crowd",
                                       limit=limit)  # fmt: skip
            assert got == exact(spread, q, "crowd", limit)
        got = scope_vector_ranking(scope_id=spread.pk, vector=q, embedding_model="crowd",
                                   limit=30, filter=goals)  # fmt: skip
        assert got == exact(spread, q, "crowd", 30, goals) and len(got) == 30


def test_a_band_past_the_candidates_kept_is_read_again(alice):
    """300 facts closer to each other than the margin: every one may be the nearest, so
    the scope's copies are read again for the whole band; spread-out facts are not."""
    rng = np.random.default_rng(8)
    base = rng.standard_normal(384)
    base /= np.linalg.norm(base)
    tight = crowd(alice, "tight", base, 1e-4, 300, seed=2)
    q = base.astype(np.float32)
    for limit in (1, 50):
        assert 300 > 2 * limit + 100  # more than the candidates kept

        def rank(limit=limit):
            return scope_vector_ranking(scope_id=tight.pk, vector=q, embedding_model="crowd",
                                        limit=limit)  # fmt: skip

        assert rank() == exact(tight, q, "crowd", limit)
        assert rescanned(tight, q, limit)
    loose = crowd(alice, "loose", base, 1.0, 300, seed=3)  # random directions
    with connection.cursor() as cur:
        cur.execute(
            "SELECT max(hd) - min(hd) FROM (SELECT half <=> l2_normalize(%s::vector)::halfvec "
            "AS hd FROM memories_fact_half WHERE scope_id = %s ORDER BY hd LIMIT 10) x",
            [q.tolist(), loose.pk],
        )
        assert cur.fetchone()[0] > HALF_MARGIN  # the ten best are further apart

    def rank_loose():
        return scope_vector_ranking(scope_id=loose.pk, vector=q, embedding_model="crowd",
                                    limit=10)  # fmt: skip

    assert rank_loose() == exact(loose, q, "crowd", 10)
    assert not rescanned(loose, q, 10)


class Given:
    """An embedder answering one vector."""

    model = "crowd"

    def __init__(self, vector: np.ndarray):
        self.vector = vector

    def embed(self, texts):
        return [self.vector for _ in texts]


def searched(scope: Scope, q: np.ndarray, query: str, **options) -> list:
    result = fact_search(owner=scope.owner_id, scope=scope, query=query,
                              embedder=Given(q), **options)  # fmt: skip
    return [(h.id, h.similarity, h.keyword_score, h.score) for h in result.hits]


def reference(scope: Scope, q: np.ndarray, query: str, limit=10, offset=0, filter=None,
              half_life_days=30.0) -> list:  # fmt: skip
    rows = reference_search(scope.owner, tuple(scope.path), query, embedder=Given(q),
                            limit=limit, offset=offset, filter=filter,
                            half_life=half_life_days)  # fmt: skip
    return [(pk, sim, kw, score) for pk, score, sim, kw in rows]


def test_the_search_through_the_copies_is_the_exact_search(alice):
    """The search statement re-ranks from the 32-bit vectors only the candidates that
    can come back: its hits, their order and figures are those of the exact search,
    on facts at near-equal distances around the vector leg's cut (every one of them
    in doubt: in the leg or not?), decayed by age, with keywords, filters, offsets."""
    rng = np.random.default_rng(11)
    base = rng.standard_normal(384)
    base /= np.linalg.norm(base)
    ring_scope = ring(alice, "ring", base, 0.3 + 3e-6 * rng.permutation(70), seed=4)
    far = rng.standard_normal((60, 384))
    far /= np.linalg.norm(far, axis=1, keepdims=True)
    spread = write(alice, "spread", np.vstack([far, base + 0.05 * far[:40]]))
    q = base.astype(np.float32)
    cases = [
        dict(query="zzz"),
        dict(query="chess piano"),
        dict(query="sailing", limit=5, offset=7),
        dict(query="tea", limit=30, half_life_days=7.0),
        dict(query="rust chess", filter=FactFilter(categories=["goal"], min_confidence=0.8)),
        dict(query="zzz", half_life_days=0.0),
    ]
    for scope in (ring_scope, spread):
        for case in cases:
            case = {"limit": 10, "half_life_days": 30.0, **case}
            query = case.pop("query")
            got, want = searched(scope, q, query, **case), reference(scope, q, query, **case)
            assert [g[:3] for g in got] == [w[:3] for w in want], (scope.path, query, case)
            # (scores to 1e-6: the decay's "now" is a few ms later in the second call)
            assert [g[3] for g in got] == pytest.approx([w[3] for w in want], abs=1e-6)


@pytest.mark.parametrize("dims", [768, 1024, 1536])
def test_facts_of_larger_dimensions_are_stored_and_searched(alice, dims):
    """The old covering index held the 32-bit vector in its btree tuples (at most 2,704
    bytes): a fact of 768 dimensions or more failed to insert. Up to 1,024 the copy is
    ranked; beyond, the scope's rows in the table."""
    embedder = Dims(dims)
    facts = [FactIn(f"fact {i} about topic {i % 5}", confidence=0.9) for i in range(40)]
    decisions = fact_add(owner=alice, scope=("org", "wide"), facts=facts,
                              embedder=embedder)  # fmt: skip
    assert [d.action for d in decisions] == ["add"] * 40
    scope = scope_find(owner=alice, scope=("org", "wide"))
    assert len(copies(scope)) == (40 if dims <= HALF_MAX_DIMENSIONS else 0)
    q = embedder.embed(["what about topic 3"])[0]
    result = fact_search(owner=alice, scope=scope, query="zzz", limit=10, embedder=embedder,
                              query_vector=q, half_life_days=0)  # fmt: skip
    want = exact(scope, q, embedder.model, 10)
    assert [(h.id, h.similarity) for h in result.hits] == want
    # A duplicate is still found (the add's nearest-fact check reads the same ranking).
    again = fact_add(owner=alice, scope=scope, facts=[FactIn("a sentence seen for the first time")],
                          embedder=embedder, dedup_threshold=-1.0)  # fmt: skip
    assert again[0].action == "duplicate" and again[0].match == "semantic"


@pytest.mark.django_db(transaction=True)
def test_the_migration_copies_the_facts_already_there(alice, monkeypatch):
    """Migration 0008 on a table that holds facts: the copies are made in batches (three
    facts each here), every fact of a scope and of at most 1,024 dimensions."""
    add_facts(alice, ("org", "a"), 8)
    add_facts(alice, ("org", "b"), 2, dims=1536)
    migration = importlib.import_module("memories.facts.migrations.0008_vector_half")
    monkeypatch.setattr(migration, "BATCH", 3)
    with old_schema(), connection.schema_editor(atomic=False) as editor:
        migration.backward(None, editor)
        with connection.cursor() as cur:
            cur.execute("SELECT to_regclass('memories_vector_half')")
            assert cur.fetchone()[0] is None
        migration.forward(None, editor)
    assert out_of_sync() == []
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM memories_fact_half")
        assert cur.fetchone()[0] == 8
    # ... and the triggers are back.
    fact_add(owner=alice, scope=("org", "a"), facts=[FactIn("alice fact 9")],
                  embedder=Dims(384))  # fmt: skip
    assert out_of_sync() == [] and len(copies(scope_find(owner=alice, scope=("org", "a")))) == 9
