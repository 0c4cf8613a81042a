"""The one search of facts at the personal doors: hybrid ranking finds what cosine alone
misses (issue 15), the chat proxy's block is that search's answer, and global memories
are ranked by the same search in the owner's global scope."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memories.facts.injection import format_for_injection, relevant_hits
from memories.facts.models import Fact
from memories.facts.scopes import end_user_ensure, global_scope_ensure
from memories.facts.search import fact_search
from memories.proxy.chat import chat_prepare
from tests.memories.facts.seed import seed

FACTS = (
    "User lives in Lisbon and loves sailing boats",
    "User has a dog named Rex",
    "User plays the violin",
    "User works as a nurse",
)


@pytest.fixture
def user_with_facts(alice, fixture_embedder):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    seed(end_user, *FACTS)
    return end_user


def test_where_do_i_live_finds_the_fact_cosine_alone_misses(alice, user_with_facts):
    found = fact_search(owner=alice, scope=user_with_facts, query="Where do I live?")
    assert found.mode == "hybrid"
    assert [h.content for h in found.hits][0] == FACTS[0] and len(found.hits) == 4
    first = found.hits[0]
    # MiniLM gives the fact 0.236: under a 0.3 cut cosine alone injects nothing; the
    # keyword leg ("live") makes it relevant.
    assert first.similarity == pytest.approx(0.236, abs=1e-3)
    assert first.keyword_score and first.score > first.similarity
    assert [h.content for h in relevant_hits(found.hits, threshold=0.3)] == [FACTS[0]]
    assert all(h.keyword_score is None for h in found.hits[1:])


def test_the_chat_proxy_injects_it_first_at_the_defaults(alice, user_with_facts, settings):
    settings.MEMORY_SCORE_THRESHOLD = 0.3
    for question in ("Where do I live?", "Which city do I live in?"):
        body = {"messages": [{"role": "user", "content": question}]}
        prepared = chat_prepare(owner_id=alice.pk, body=body, external_id="u1")
        # The relevant fact first (the search's order), then the rest by confidence
        # as the engine injects them, only the first marked relevant.
        assert [m.content for m in prepared.memories if m.relevant] == [FACTS[0]]
        assert prepared.memories[0].content == FACTS[0]
        assert {m.content for m in prepared.memories} == set(FACTS)
        assert FACTS[0] in prepared.body["messages"][0]["content"]
        found = fact_search(owner=alice, scope=user_with_facts, query=question)
        assert prepared.memories[0].score == pytest.approx(found.hits[0].score, rel=1e-6)


def test_global_memories_are_searched_in_their_own_scope(alice, user_with_facts):
    glob = global_scope_ensure(owner=alice)
    seed(glob, "User lives in New York")
    query = "Which city do I live in?"
    own = fact_search(owner=alice, scope=user_with_facts, query=query, limit=10)
    assert {h.content for h in own.hits} == set(FACTS)  # not the owner's global memory
    both = fact_search(owner=alice, scope=user_with_facts, query=query, limit=10,
                       include_globals=True)  # fmt: skip
    assert [h.id for h in both.hits[:4]] == [h.id for h in own.hits]
    assert [(h.content, h.scope_path) for h in both.hits[4:]] == [("User lives in New York", ())]
    alone = fact_search(owner=alice, scope=glob, query=query)
    assert [h.id for h in alone.hits] == [h.id for h in both.hits[4:]]
    # The block: the user's facts, then (a user with few facts) the relevant globals.
    block = format_for_injection(owner=alice, scope=user_with_facts, max_tokens=600,
                                 query=query, with_globals=True)  # fmt: skip
    assert [h.content for h in block.globals] == ["User lives in New York"]
    assert block.text.endswith("\n- [global] User lives in New York")


def test_a_search_answers_the_facts_times_the_orm_reads(alice, fixture_embedder):
    user = end_user_ensure(owner=alice, external_id="u1")
    seed(user, *FACTS[:2])
    Fact.objects.update(valid_from=datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC))
    hits = fact_search(owner=alice, scope=user, query="Where do I live?").hits
    stored = {f.pk: f for f in Fact.objects.all()}
    assert len(hits) == 2
    for hit in hits:
        fact = stored[hit.id]
        times = (hit.created_at, hit.updated_at, hit.observed_at, hit.valid_from, hit.recorded_from)
        assert times == (fact.created_at, fact.updated_at, fact.observed_at, fact.valid_from,
                         fact.recorded_from)  # fmt: skip
        assert {t.isoformat()[-6:] for t in times if t is not None} == {"+00:00"}
        assert hit.valid_to is None and hit.recorded_to is None
