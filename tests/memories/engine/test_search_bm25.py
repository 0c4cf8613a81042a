"""The engine search's keyword leg is BM25 over the scope's facts: its scores equal a
BM25 computed in Python from the facts' lexemes, a rare word outranks a common one,
the statistics are the scope's (kept on its row by migration 0010's triggers, exact
after every kind of write), and equal scores come back newer first, then by id."""

from __future__ import annotations

import importlib
import math
from datetime import timedelta

import numpy as np
import pytest
from django.db import connection
from django.utils import timezone

from core.db_backend.base import table_owner
from knowledge.retrieval import bm25
from memories.engine.facade import MemoryEngine
from memories.facts.models import Fact, FactLink, Scope
from memories.facts.scopes import scope_find
from memories.facts.search import FactFilter, fact_keyword_leg, fact_search
from memories.facts.services import (
    FactIn,
    fact_add,
    fact_delete,
    fact_share,
    fact_update,
    scope_erase,
)
from tests.memories.engine.test_search_statement import Broken
from tests.memories.engine.test_vector_half import Dims
from tests.memories.facts.old_schema import old_schema

pytestmark = pytest.mark.django_db

# Relative tolerance between the statement's float8 sums and Python's (the same
# operations; only the order of the sum's terms may differ: a few units in the last
# place).
REL = 1e-12


def keyword_ranking(scope: Scope, text: str, limit: int = 100, filter=None):
    """[(fact id, BM25 score)] of the scope's keyword leg run alone, best first."""
    leg = fact_keyword_leg(scope, text, limit, filter)
    return [] if leg is None else [(row[0], float(row[1])) for row in leg.run()]


def lexemes(text: str) -> dict[str, int]:
    """{lexeme: occurrences} of ``text`` by PostgreSQL's English configuration."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT lexeme, coalesce(array_length(positions, 1), 1) "
            "FROM unnest(to_tsvector('english'::regconfig, %s))",
            [text],
        )
        return dict(cur.fetchall())


def python_bm25(scope: Scope, query: str) -> dict:
    """{fact id: BM25 score} of the scope's facts holding a query lexeme, computed here
    from each fact's lexemes: N, df and the mean length over the scope's facts (its
    own and the ones shared with it), k1 and b the knowledge side's."""
    k1, b = bm25.K1, bm25.B
    docs = {v.pk: lexemes(v.content) for v in Fact.objects.filter(links__scope=scope)}
    terms = set(lexemes(query))
    n = len(docs)
    avgdl = max(sum(len(d) for d in docs.values()), 1) / max(n, 1)
    df = {t: sum(t in d for d in docs.values()) for t in terms}
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms}
    return {
        pk: sum(
            idf[t] * d[t] * (k1 + 1) / (d[t] + k1 * (1 - b + b * len(d) / avgdl))
            for t in terms & d.keys()
        )
        for pk, d in docs.items()
        if terms & d.keys()
    }


def stats() -> dict[int, tuple[int, int, int, int]]:
    """Per scope: (text_facts, text_lexemes) on its row, and the same recounted from
    the facts whose scope it is."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT e.id, e.text_facts, e.text_lexemes, (SELECT count(*) FROM memories_fact v "
            "WHERE v.scope_id = e.id), (SELECT coalesce(sum(length(v.search_vector) - 1), 0) "
            "FROM memories_fact v WHERE v.scope_id = e.id) FROM memories_scope e"
        )
        return {row[0]: tuple(row[1:]) for row in cur.fetchall()}


def assert_stats_true() -> None:
    wrong = {k: v for k, v in stats().items() if v[:2] != v[2:]}
    assert wrong == {}


FACTS = [
    "Alice drinks coffee every morning before work",
    "Alice drinks green tea in the afternoon, tea with lemon",  # tea twice: tf 2
    "Coffee coffee coffee: Alice really loves coffee",  # tf 4
    "Alice moved to Lisbon last spring",
    "Alice plays chess with her brother on Sundays",
    "Alice is learning to sail small boats near Lisbon on weekends with friends",
    "Alice prefers window seats",
    "Her brother sells coffee beans at the market",
    "Alice keeps a garden of tomatoes and basil",
    "Alice",
]


def seed(owner) -> Scope:
    """FACTS in ("user", "alice") over ten days; a fact of ("user", "bob") shared with
    her; more coffee in bob's scope (which must not change her statistics)."""
    now = timezone.now()
    e = Dims(384)
    fact_add(
        owner=owner, scope=("user", "alice"), embedder=e,
        facts=[FactIn(t, confidence=0.9, observed_at=now - timedelta(days=i),
                      category=["preference", "knowledge"][i % 2])
               for i, t in enumerate(FACTS)],
    )  # fmt: skip
    fact_add(
        owner=owner, scope=("user", "bob"), embedder=e,
        facts=[FactIn(f"Bob drinks coffee number {i}", confidence=0.9) for i in range(6)]
        + [FactIn("Alice and Bob share a coffee machine in Lisbon", confidence=0.9)],
    )  # fmt: skip
    alice = scope_find(owner=owner, scope=("user", "alice"))
    fact_share(scope=alice, fact=Fact.objects.get(content__startswith="Alice and Bob"))
    return alice


QUERIES = ["coffee in Lisbon", "tea", "chess brother", "Alice", "coffee tea lemon boats", "zzz"]


def test_the_keyword_leg_is_bm25_as_computed_in_python(alice):
    scope = seed(alice)
    assert_stats_true()
    for query in QUERIES:
        want = python_bm25(scope, query)
        got = keyword_ranking(scope, query, limit=100)
        assert {pk for pk, _ in got} == set(want), query
        for pk, score in got:
            assert score == pytest.approx(want[pk], rel=REL), (query, pk)
        # Keyword-only search (the embedder down, no decay): the same figures, the
        # score each one's share of the best.
        result = fact_search(owner=alice, scope=scope, query=query, limit=100,
                                  embedder=Broken(), half_life_days=0)  # fmt: skip
        assert result.mode == "keyword"
        assert {h.id: h.keyword_score for h in result.hits} == pytest.approx(want, rel=REL)
        best = max(want.values(), default=1.0)
        for hit in result.hits:
            assert hit.score == pytest.approx(want[hit.id] / best, rel=REL)
    # Bob's own coffee facts count in his scope, not in hers: his statistics differ.
    bob = scope_find(owner=alice, scope=("user", "bob"))
    mine = dict(keyword_ranking(scope, "coffee", limit=100))
    his = dict(keyword_ranking(bob, "coffee", limit=100))
    shared = Fact.objects.get(content__startswith="Alice and Bob").pk
    assert mine[shared] != his[shared]
    assert his == pytest.approx(python_bm25(bob, "coffee"), rel=REL)


def test_a_rare_word_outranks_a_common_one(alice):
    """Two facts of the same length, one holding a word every other fact holds, the
    other a word only it holds: BM25 puts the rare one first, where ts_rank scores
    them alike."""
    e = Dims(384)
    facts = [FactIn(f"coffee note {w}", confidence=0.9) for w in
             ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")]  # fmt: skip
    facts += [FactIn("coffee trip planned", confidence=0.9),
              FactIn("lisbon trip planned", confidence=0.9)]  # fmt: skip
    fact_add(owner=alice, scope=("user", "alice"), facts=facts, embedder=e)
    common = Fact.objects.get(content="coffee trip planned")
    rare = Fact.objects.get(content="lisbon trip planned")
    with connection.cursor() as cur:
        cur.execute(
            "SELECT ts_rank(search_vector, to_tsquery('english', 'coffee | lisbon')) "
            "FROM memories_fact WHERE id = ANY(%s)",
            [[common.pk, rare.pk]],
        )
        assert len({r[0] for r in cur.fetchall()}) == 1  # alike for ts_rank
    result = fact_search(owner=alice, scope=("user", "alice"), query="coffee or lisbon?",
                              embedder=Broken(), limit=3, half_life_days=0)  # fmt: skip
    assert result.hits[0].id == rare.pk
    assert result.hits[0].score == 1.0
    assert result.hits[0].keyword_score > 2 * result.hits[1].keyword_score
    # Hybrid (the seeded vectors say nothing about the words): still first.
    hybrid = fact_search(owner=alice, scope=("user", "alice"), query="coffee or lisbon?",
                              embedder=e, limit=3)  # fmt: skip
    assert hybrid.mode == "hybrid" and hybrid.hits[0].id == rare.pk


def test_filters_choose_the_facts_not_the_statistics(alice):
    scope = seed(alice)
    everything = dict(keyword_ranking(scope, "coffee Alice", limit=100))
    knowledge = FactFilter(categories=["knowledge"])
    result = fact_search(owner=alice, scope=scope, query="coffee Alice", limit=100,
                              filter=knowledge, embedder=Broken(), half_life_days=0)  # fmt: skip
    expected = {
        pk: score
        for pk, score in everything.items()
        if Fact.objects.get(pk=pk).category == "knowledge"
    }
    assert len(expected) >= 3 and len(expected) < len(everything)
    assert {h.id: h.keyword_score for h in result.hits} == expected  # the same floats
    assert all(h.category == "knowledge" for h in result.hits)
    confident = FactFilter(min_confidence=0.95)
    assert fact_search(owner=alice, scope=scope, query="coffee Alice", filter=confident,
                            embedder=Broken()).hits == []  # fmt: skip


def test_statistics_follow_every_write(alice, bob):
    scope = seed(alice)
    fact_add(owner=bob, scope=("user", "alice"), facts=[FactIn("bob's alice")],
                  embedder=Dims(384))  # fmt: skip
    assert_stats_true()
    fact = Fact.objects.get(content=FACTS[0])
    # A new text (its lexemes change), a confidence (nothing to change), a deletion.
    fact_update(owner=alice, fact_id=fact.pk, content="Alice drinks espresso")
    fact_update(owner=alice, fact_id=Fact.objects.get(content=FACTS[1]).pk,
                     confidence=0.8)  # fmt: skip
    fact_delete(owner=alice, fact_id=Fact.objects.get(content=FACTS[2]).pk)
    assert_stats_true()
    for query in QUERIES:
        got = dict(keyword_ranking(scope, query, limit=100))
        assert got == pytest.approx(python_bm25(scope, query), rel=REL)
    # Shared with another scope (it then has no scope of its own), evicted, erased.
    other = Scope.objects.create(owner=alice, path=["org", "other"])
    fact_share(scope=other, fact=Fact.objects.get(content=FACTS[3]))
    assert_stats_true()
    got = dict(keyword_ranking(scope, "Lisbon", limit=100))
    assert got == pytest.approx(python_bm25(scope, "Lisbon"), rel=REL)
    fact_add(owner=alice, scope=scope, facts=[FactIn("Alice reads", confidence=0.95)],
                  embedder=Dims(384), max_facts=5)  # fmt: skip
    assert_stats_true()
    FactLink.objects.filter(scope=other).delete()
    scope_erase(scope=scope)
    assert_stats_true()
    # Django never writes the columns: a save of the scope leaves them as they are.
    bob_scope = scope_find(owner=alice, scope=("user", "bob"))
    bob_scope.last_seen_at = bob_scope.created_at
    bob_scope.save()
    assert_stats_true()
    assert stats()[bob_scope.pk][:2] != (0, 0)


@pytest.mark.django_db(transaction=True)
def test_the_migration_counts_the_facts_already_there_and_a_truncate_zeroes(alice):
    seed(alice)
    migration = importlib.import_module("memories.facts.migrations.0010_scope_text_stats")
    with old_schema(), connection.cursor() as cur:
        cur.execute(migration.DROP)
        cur.execute(migration.COLUMNS)
        cur.execute(migration.CREATE)
    assert sorted(v[0] for v in stats().values()) == [6, 10]  # (bob's shared one: no scope)
    assert_stats_true()
    with table_owner(connection), connection.cursor() as cur:  # (TRUNCATE: the owner's)
        cur.execute("TRUNCATE memories_fact CASCADE")
    assert {v[:2] for v in stats().values()} == {(0, 0)}


class Axes:
    """The query along the first axis, each fact along an axis of its own: every fact's
    similarity is 0, the keyword leg decides (a test of ties in hybrid mode)."""

    provider, model, dimensions = "axes", "axes-8", 8

    def __init__(self, texts: list[str]):
        self.texts = texts

    def embed(self, texts):
        out = []
        for text in texts:
            v = np.zeros(8, dtype=np.float32)
            v[self.texts.index(text) + 1 if text in self.texts else 0] = 1.0
            out.append(v)
        return np.asarray(out)


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_equal_scores_come_back_newer_first_then_by_id(alice, mode):
    """Facts with the same words (the same BM25 score) and, in hybrid mode, the same
    similarity: the newer first, those said at the same moment by id, in the engine's
    search and the facade's, whoever the owner."""
    now = timezone.now()
    texts = ["tea garden", "garden tea", "tea, garden", "garden: tea", "tea in the garden"]
    at = [now - timedelta(days=3), now - timedelta(days=1), now - timedelta(days=2),
          now - timedelta(days=2), now - timedelta(days=2)]  # fmt: skip
    embedder = Axes(texts)
    fact_add(owner=alice, scope=("user", "alice"), embedder=embedder,
                  facts=[FactIn(t, confidence=0.9, observed_at=a) for t, a in zip(texts, at)])  # fmt: skip
    by_text = {v.content: v for v in Fact.objects.filter(owner=alice)}
    same_day = sorted((by_text[t].pk for t in texts[2:]), key=str)
    expected = [by_text["garden tea"].pk, *same_day, by_text["tea garden"].pk]
    for half_life in (0.0, 30.0):
        result = fact_search(
            owner=alice, scope=("user", "alice"), query="tea garden?", limit=10,
            half_life_days=half_life, embedder=embedder if mode == "hybrid" else Broken(),
        )  # fmt: skip
        assert result.mode == mode
        assert [h.id for h in result.hits] == expected
        if half_life == 0:
            assert len({h.score for h in result.hits}) == 1  # all tied
        # (with decay the newer one scores higher anyway; the same-day ones still tie)
        page = fact_search(
            owner=alice, scope=("user", "alice"), query="tea garden?", limit=2, offset=1,
            half_life_days=half_life, embedder=embedder if mode == "hybrid" else Broken(),
        )  # fmt: skip
        assert [h.id for h in page.hits] == expected[1:3]
    if mode == "keyword":
        engine = MemoryEngine(owner=alice)
        found = engine.search(["user", "alice"], "tea garden", half_life_days=0)
        assert [h.id for h in found.hits] == expected
