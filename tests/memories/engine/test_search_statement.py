"""The facts' search as the retrieval engine runs it: the same ranking as its definition
(each leg run alone, merged in Python), min(limit, matching) on a large scope, the
keyword-only fallback, one round trip, the walk's settings and plan for its own
transaction only."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.scoring import decay
from knowledge.retrieval import hnsw
from memories.facts import search
from memories.facts.models import Fact
from memories.facts.scopes import scope_find
from memories.facts.search import (
    FactFilter,
    _pool,
    _vector_pool,
    fact_keyword_leg,
    fact_search,
    fact_vector_leg,
)
from memories.facts.services import FactIn, fact_add, fact_share
from tests.memories.engine.test_search import _SeededEmbedder as Seeded

pytestmark = pytest.mark.django_db

TOPICS = ["coffee", "hiking", "python", "piano", "garden", "chess", "sailing"]


class Broken:
    model = "broken"

    def embed(self, texts):
        raise RuntimeError("embedding service down")


def exact_vector_ranking(*, scope_id, vector, embedding_model, limit, filter=None):
    """Every fact of the scope (its own and its shared ones) by the cosine distance of
    its stored vector, ties by id: the plain exact scan of the table, no 16-bit copy."""
    where, params = (filter or FactFilter()).sql("v.")
    where = f" AND v.dimensions = %s AND v.embedding_model = %s{where}"
    params = [len(vector), embedding_model, *params]
    text = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, d FROM (SELECT v.id, v.embedding <=> %s::vector AS d "
            f"FROM memories_fact v WHERE v.scope_id = %s{where} UNION ALL "
            "SELECT v.id, v.embedding <=> %s::vector FROM memories_factlink uv "
            "JOIN memories_fact v ON v.id = uv.fact_id WHERE uv.scope_id = %s "
            f"AND uv.shared AND v.scope_id IS NULL{where}) r ORDER BY d, id LIMIT %s",
            [text, scope_id, *params, text, scope_id, *params, limit],
        )
        return [(row[0], 1.0 - float(row[1])) for row in cur.fetchall()]


def walked(owner, scope, query, embedder, pool, filter=None) -> bool:
    """Whether the search's vector leg, run alone, walked the HNSW index."""
    row = scope_find(owner=owner, scope=scope)
    vector = [float(x) for x in embedder.embed([query])[0]]
    rows = fact_vector_leg(row, vector, embedder.model, pool, filter).run()
    return bool(rows) and all(r[2] for r in rows if r[0] not in _shared(row))


def _shared(row) -> set:
    return set(
        Fact.objects.filter(links__scope=row, links__shared=True).values_list("id", flat=True)
    )


def reference_search(owner, scope, query, *, embedder, limit, offset=0, filter=None, half_life):
    """The definition of the search: its vector leg (the exact scan of the table, or when
    the scope is walked the walk run alone) and its keyword leg (run alone) merged in
    Python: w x similarity (negative: 0) + (1 - w) x BM25 over the best, times the decay,
    a keyword hit the vector leg did not give counting its own similarity (that of the
    exact scan); equal scores ordered newer first, then by id."""
    row = scope_find(owner=owner, scope=scope)
    pool, vector_pool = _pool(limit, offset), _vector_pool(limit, offset)
    try:
        vector, model = [float(x) for x in embedder.embed([query])[0]], embedder.model
    except Exception:
        vector, model = None, None
    vector_hits: list[tuple[uuid.UUID, float]] = []
    if vector is not None:
        rows = fact_vector_leg(row, vector, model, vector_pool, filter).run()
        if any(r[2] for r in rows):  # walked: the walk is the leg's definition
            vector_hits = [(r[0], 1.0 - float(r[1])) for r in rows]
        else:
            vector_hits = exact_vector_ranking(
                scope_id=row.pk, vector=vector, embedding_model=model, limit=vector_pool,
                filter=filter,
            )  # fmt: skip
    leg = fact_keyword_leg(row, query, pool, filter)
    keyword_hits = [] if leg is None else [(r[0], float(r[1])) for r in leg.run()]
    similarity, keyword = dict(vector_hits), dict(keyword_hits)
    if vector is not None:
        every = exact_vector_ranking(
            scope_id=row.pk, vector=vector, embedding_model=model, limit=10**6, filter=filter
        )
        similarity |= {pk: sim for pk, sim in every if pk in keyword and pk not in similarity}
    best = max(keyword.values(), default=0.0) or 1.0
    weight = 0.0 if vector is None else search.FACTS.vector_weight
    now = timezone.now()
    scored = []
    for pk, observed in Fact.objects.filter(pk__in=set(similarity) | set(keyword)).values_list(
        "id", "observed_at"
    ):
        sim, kw = similarity.get(pk), keyword.get(pk)
        relevance = weight * max(sim or 0.0, 0.0) + (1 - weight) * (kw or 0.0) / best
        if half_life:
            relevance *= decay(observed, half_life, now=now)
        scored.append((pk, relevance, sim, kw, observed))
    # Equal scores: the newer fact first, then the id (never the random id alone).
    scored.sort(key=lambda h: (-h[1], -_micros(h[4]), str(h[0])))
    return [h[:4] for h in scored[offset : offset + limit]]


def _micros(at):
    return (at - _EPOCH) // timedelta(microseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _seed(owner, embedder):
    """120 facts in ("org", "big") over four months, words shared between them; 20 in
    ("org", "other"); 3 of the latter shared with ("org", "big") (linked: no scope)."""
    now = timezone.now()
    facts = [
        FactIn(
            f"fact {i} about {TOPICS[i % 7]} and {TOPICS[(i * 3) % 7]} number{i % 11}",
            category=["preference", "knowledge", "goal"][i % 3],
            confidence=0.7 + (i % 4) * 0.1,
            observed_at=now - timedelta(days=(i * 37) % 120),
        )
        for i in range(120)
    ]
    fact_add(owner=owner, scope=("org", "big"), facts=facts, embedder=embedder,
                  max_facts=1000)  # fmt: skip
    others = [FactIn(f"other {i} likes {TOPICS[i % 7]}", confidence=0.9) for i in range(20)]
    decisions = fact_add(owner=owner, scope=("org", "other"), facts=others, embedder=embedder)
    big = scope_find(owner=owner, scope=("org", "big"))
    for decision in decisions[:3]:
        fact_share(scope=big, fact=Fact.objects.get(pk=decision.fact_id))


QUERIES = ["coffee and chess", "what about sailing number3", "piano", "nothing matches zzz"]


def _tune(monkeypatch, **changes):
    monkeypatch.setattr(search, "FACTS", replace(search.FACTS, **changes))


@pytest.mark.parametrize("exact_max", [2000, 10])
def test_the_statement_ranks_as_the_definition(alice, monkeypatch, exact_max):
    embedder = Seeded()
    _seed(alice, embedder)
    _tune(monkeypatch, exact_max=exact_max, walk_min_share=0.0)  # 10: past it, the walk
    cases = [
        dict(limit=10, half_life=30.0),
        dict(limit=5, offset=3, half_life=0.0),
        dict(limit=10, half_life=30.0, filter=FactFilter(categories=["goal", "knowledge"])),
        dict(limit=10, half_life=7.0, filter=FactFilter(min_confidence=0.85)),
        dict(limit=30, half_life=30.0),
    ]
    compared = 0
    for query in QUERIES:
        for case in cases:
            case = dict(case)
            half_life = case.pop("half_life")
            expected = reference_search(alice, ("org", "big"), query, embedder=embedder,
                                        half_life=half_life, **case)  # fmt: skip
            result = fact_search(
                owner=alice, scope=("org", "big"), query=query, embedder=embedder,
                half_life_days=half_life, **case,
            )  # fmt: skip
            # (scores to 1e-6: the decay's "now" is a few ms later in the second call)
            got = [(h.id, h.similarity, h.keyword_score) for h in result.hits]
            assert got == [(pk, sim, kw) for pk, _, sim, kw in expected], (query, case)
            scores = [s for _, s, _, _ in expected]
            assert [h.score for h in result.hits] == pytest.approx(scores, abs=1e-6)
            pool = _vector_pool(case["limit"], case.get("offset", 0))
            path = walked(alice, ("org", "big"), query, embedder, pool, case.get("filter"))
            if exact_max == 2000 or pool >= 123:
                assert not path  # small, or the pool is the whole scope: exact
            elif "filter" not in case:
                assert path
            compared += 1
    assert compared == len(QUERIES) * len(cases)


def test_large_scope_returns_min_limit_matching_when_the_walk_comes_back_short(alice, monkeypatch):
    """A filter only 4 facts of the scope pass: the walk (strict order, scan cap) may
    come back short; the search then ranks the scope exactly and still returns all 4."""
    embedder = Seeded()
    _seed(alice, embedder)
    _tune(monkeypatch, exact_max=10, walk_min_share=0.0)
    monkeypatch.setattr(hnsw, "MAX_SCAN_TUPLES", 1000)  # the lowest cap: walks stop early
    rare = FactFilter(min_confidence=0.95, categories=["goal"])  # i % 3 == 2 and i % 4 == 3
    matching = Fact.objects.filter(scope__path=["org", "big"], category="goal",
                                     confidence__gte=0.95).count()  # fmt: skip
    assert 0 < matching < 20
    for limit in (5, 50):
        result = fact_search(
            owner=alice, scope=("org", "big"), query="sailing", limit=limit, filter=rare,
            embedder=embedder,
        )  # fmt: skip
        assert len(result.hits) == min(limit, matching)
        # the walk came back short: redone exactly
        assert not walked(alice, ("org", "big"), "sailing", embedder, _vector_pool(limit, 0), rare)
        assert all(h.category == "goal" and h.confidence >= 0.95 for h in result.hits)
    everything = fact_search(owner=alice, scope=("org", "big"), query="sailing", limit=200,
                                  embedder=embedder)  # fmt: skip
    assert len(everything.hits) == 123  # 120 of its own + 3 shared: every fact matches
    # A pool past pgvector's largest ef_search (1000): the walk's settings stay valid.
    _tune(monkeypatch, exact_max=2000)
    huge = fact_search(owner=alice, scope=("org", "big"), query="sailing", limit=300,
                            embedder=embedder)  # fmt: skip
    assert len(huge.hits) == 123


def test_keyword_only_when_the_embedder_fails_in_one_statement(alice, monkeypatch):
    _seed(alice, Seeded())
    _tune(monkeypatch, exact_max=10)
    with CaptureQueriesContext(connection) as queries:
        result = fact_search(
            owner=alice, scope=("org", "big"), query="sailing chess", limit=200, embedder=Broken()
        )
    assert result.mode == "keyword" and "embedding service down" in result.embedder_error
    assert "vector leg" not in queries.captured_queries[-1]["sql"]
    assert {h.content for h in result.hits} == set(
        Fact.objects.filter(scope__path=["org", "big"])
        .filter(content__regex=r"\m(sailing|chess)\M")
        .values_list("content", flat=True)
    )
    assert all(h.similarity is None and h.keyword_score for h in result.hits)
    expected = reference_search(alice, ("org", "big"), "sailing chess", embedder=Broken(),
                                limit=200, half_life=30.0)  # fmt: skip
    assert [h.id for h in result.hits] == [pk for pk, _, _, _ in expected]
    scores = [s for _, s, _, _ in expected]
    assert [h.score for h in result.hits] == pytest.approx(scores, abs=1e-6)
    assert len(queries) == 2  # the scope's row, then the one statement


@pytest.mark.parametrize("exact_max", [2000, 10])
def test_search_is_one_round_trip_and_opens_no_transaction(alice, monkeypatch, exact_max):
    embedder = Seeded()
    _seed(alice, embedder)
    _tune(monkeypatch, exact_max=exact_max, walk_min_share=0.0)
    row = scope_find(owner=alice, scope=("org", "big"))
    vector = embedder.embed(["piano"])[0]
    fact_search(owner=alice, scope=row, query="piano", embedder=embedder, query_vector=vector)
    with CaptureQueriesContext(connection) as queries:
        result = fact_search(
            owner=alice, scope=row, query="piano", embedder=embedder, query_vector=vector
        )
    assert len(result.hits) == 10
    assert len(queries) == 1, [q["sql"][:80] for q in queries.captured_queries]
    assert "BEGIN" not in queries[0]["sql"].upper().split("SELECT")[0]


@pytest.mark.django_db(transaction=True)
def test_the_walks_settings_end_with_the_search(alice, monkeypatch):
    """Outside a transaction the settings and the statement form one implicit
    transaction (pipelined): the connection's settings are as they were after it."""
    embedder = Seeded()
    _seed(alice, embedder)
    _tune(monkeypatch, exact_max=10, walk_min_share=0.0)
    assert connection.get_autocommit()
    result = fact_search(owner=alice, scope=("org", "big"), query="chess", embedder=embedder)
    assert walked(alice, ("org", "big"), "chess", embedder, 50) and len(result.hits) == 10
    with connection.cursor() as cur:
        cur.execute(
            "SELECT current_setting('hnsw.ef_search'), current_setting('hnsw.iterative_scan'), "
            "current_setting('plan_cache_mode'), current_setting('enable_seqscan')"
        )
        assert cur.fetchone() == ("40", "off", "auto", "on")


def test_a_rare_scope_is_ranked_exactly_a_large_share_walked(alice, monkeypatch):
    """Past ``exact_max`` the walk needs the scope to hold ``walk_min_share`` of the table
    (planner statistics) or more than ``exact_cap`` facts."""
    embedder = Seeded()
    _seed(alice, embedder)
    with connection.cursor() as cur:
        cur.execute("ANALYZE memories_fact")
        cur.execute("SELECT reltuples FROM pg_class WHERE relname = 'memories_fact'")
        rows = cur.fetchone()[0]
    assert 140 <= rows < 200  # 123 facts of ("org", "big") + 20 of ("org", "other")

    def path(share, cap=20000):
        _tune(monkeypatch, exact_max=10, walk_min_share=share, exact_cap=cap)
        result = fact_search(owner=alice, scope=("org", "big"), query="chess",
                                  embedder=embedder)  # fmt: skip
        assert len(result.hits) == 10
        return walked(alice, ("org", "big"), "chess", embedder, 50)

    assert path(0.5)  # 123 facts are more than half of the table
    assert not path(0.95)  # ... but less than 95% of it
    assert path(0.95, cap=60)  # more than the cap: walked whatever the share


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("exact_max", [2000, 10])
def test_the_search_runs_on_its_generic_plan_through_indexes(alice, monkeypatch, exact_max):
    """Outside a transaction the search statement is planned once per connection (its
    generic plan, from the first run) with sequential scans off, both for its own
    transaction only; the answers are those of the search planned each time."""
    embedder = Seeded()
    _seed(alice, embedder)
    _tune(monkeypatch, exact_max=exact_max, walk_min_share=0.0)
    assert connection.get_autocommit()
    answers = []
    for i in range(8):
        query = TOPICS[i % len(TOPICS)]
        result = fact_search(owner=alice, scope=("org", "big"), query=query, embedder=embedder)
        assert len(result.hits) == 10
        answers.append([h.id for h in result.hits])
    with connection.cursor() as cur:
        cur.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '/* facts search */%%'"
        )
        assert cur.fetchall() == [(8, 0)]
        cur.execute("SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan')")
        assert cur.fetchone() == ("auto", "on")
    with transaction.atomic():  # (planned as usual in a caller's transaction)
        for i in range(8):
            query = TOPICS[i % len(TOPICS)]
            result = fact_search(owner=alice, scope=("org", "big"), query=query,
                                      embedder=embedder)  # fmt: skip
            assert [h.id for h in result.hits] == answers[i]
