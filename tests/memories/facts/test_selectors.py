"""Personal-memory retrieval: hybrid ranking and the relative threshold (issue 15)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from knowledge.bm25 import bm25_adhoc
from memories.facts.models import Vector
from memories.facts.selectors import memory_search, scope_keyword_ranking
from memories.facts.services import end_user_ensure, global_memory_create, memory_add
from memories.proxy.chat import chat_prepare

FACTS = (
    "User lives in Lisbon and loves sailing boats",
    "User has a dog named Rex",
    "User plays the violin",
    "User works as a nurse",
)


@pytest.fixture
def user_with_facts(alice, fixture_embedder):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    for fact in FACTS:
        memory_add(end_user=end_user, content=fact)
    return end_user


def search_args(owner, end_user, embedder, query: str) -> dict:
    """``memory_search``'s arguments for ``query`` (top 10), without the query text."""
    return {
        "owner_id": owner.pk,
        "end_user": end_user,
        "vector": embedder.embed([query])[0],
        "embedding_model": embedder.model,
        "top_k": 10,
    }


def test_where_do_i_live_finds_the_fact_cosine_alone_misses(
    alice, user_with_facts, fixture_embedder
):
    query = "Where do I live?"
    common = search_args(alice, user_with_facts, fixture_embedder, query)
    # MiniLM gives the fact 0.236: under the old 0.3 cut, cosine alone injects nothing.
    assert memory_search(**common, threshold=0.3) == []
    hits = memory_search(**common, threshold=0.2, query=query, relative_threshold=0.3)
    assert [h.content for h in hits] == ["User lives in Lisbon and loves sailing boats"]
    assert hits[0].similarity == pytest.approx(0.236, abs=1e-3)
    assert hits[0].score == pytest.approx(1.0)  # first in both rankings
    # Without the relative cut the floor alone keeps only what is related at all.
    floor_only = memory_search(**common, threshold=0.2, query=query)
    assert [h.content for h in floor_only] == [FACTS[0]]
    everything = memory_search(**common, query=query)
    assert [h.content for h in everything][0] == FACTS[0] and len(everything) == 4


def test_the_chat_proxy_injects_it_at_the_defaults(alice, user_with_facts, settings):
    settings.MEMORY_SCORE_THRESHOLD = 0.2  # the local embedder's default
    settings.MEMORY_HYBRID, settings.MEMORY_RELATIVE_THRESHOLD = True, 0.3
    for question in ("Where do I live?", "Which city do I live in?"):
        body = {"messages": [{"role": "user", "content": question}]}
        prepared = chat_prepare(owner_id=alice.pk, body=body, external_id="u1")
        # The relevant fact first (issue 15's ranking), then the rest by confidence as
        # the engine injects them (issue 12), only the first marked relevant.
        assert [m.content for m in prepared.memories if m.relevant] == [FACTS[0]]
        assert prepared.memories[0].content == FACTS[0]
        assert FACTS[0] in prepared.body["messages"][0]["content"]
    settings.MEMORY_SCORE_THRESHOLD, settings.MEMORY_HYBRID = 0.3, False  # the old behaviour
    body = {"messages": [{"role": "user", "content": "Where do I live?"}]}
    old = chat_prepare(owner_id=alice.pk, body=body, external_id="u1").memories
    assert [m for m in old if m.relevant] == []


def test_the_keyword_leg_reads_the_users_statistics_kept_on_their_row(
    alice, user_with_facts, fixture_embedder
):
    """A user's BM25 is the engine's keyword leg (statistics kept on the scope's row):
    the same figures ``bm25_adhoc`` computed from the user's facts on every call, which
    now runs only with the owner's global memories in the set."""
    docs = Vector.objects.filter(scope_id=user_with_facts.pk).annotate(text=F("content"))
    sql, params = docs.values("id", "text").query.sql_with_params()
    for query in ("Where do I live?", "dog violin nurse", "sailing boats in Lisbon, user"):
        per_call = dict(bm25_adhoc(sql, list(params), "english", query, 50))
        assert per_call
        kept = dict(scope_keyword_ranking(scope_id=user_with_facts.pk, text=query, limit=50))
        assert kept == pytest.approx(per_call, rel=1e-12)
    query = "Which city do I live in?"
    common = {**search_args(alice, user_with_facts, fixture_embedder, query), "query": query}
    with CaptureQueriesContext(connection) as queries:
        hits = memory_search(**common)
    assert hits[0].content == FACTS[0] and len(hits) == 4
    assert not any("docs AS MATERIALIZED" in q["sql"] for q in queries.captured_queries)
    global_memory_create(owner=alice, content="User lives in New York")
    with CaptureQueriesContext(connection) as queries:
        hits = memory_search(**common, include_globals=True)
    assert {h.content for h in hits} == {*FACTS, "User lives in New York"}
    assert any("docs AS MATERIALIZED" in q["sql"] for q in queries.captured_queries)
