"""The same query on the same scope returns the same facts in the same order through
every door: the personal search (``POST /api/v1/users/{id}/memories/search`` and its GET
alias), the engine's (``POST /api/v1/engine/search``), the tools endpoint
(``POST /api/v1/tools/search_memory/call``), MCP (``/mcp``), and the chat proxy, whose
injected block lists the facts the search finds relevant first, in its order, then
fills its budget with the rest by confidence."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.utils import timezone
from mcp import ClientSession

from memories.facts.injection import matching_hits, relevant_hits
from memories.facts.scopes import end_user_ensure
from memories.facts.search import fact_search
from memories.facts.services import FactIn, fact_add
from tests.fakes.openai_server import Scripted, chat_body
from tests.memories.tools.test_mcp import _key, _session

pytestmark = pytest.mark.django_db(transaction=True)
SCOPE = ["user", "u1"]
# (content, days ago said, confidence): ages and confidences differ, so the decay, the
# keyword leg and the confidence order all have something to decide.
FACTS = [
    ("User uses Node.js", 40, 0.8),
    ("User uses Bun", 2, 0.9),
    ("User likes JavaScript", 10, 0.95),
    ("User likes TypeScript", 90, 1.0),
    ("User is allergic to peanuts", 1, 0.85),
    ("User plays the violin", 5, 0.75),
    ("User lives in Lisbon and loves sailing boats", 20, 0.7),
]
QUERIES = ["Which JavaScript runtime should I use for my server?", "Where do I live?"]


@pytest.fixture
def facts(alice, fixture_embedder):
    now = timezone.now()
    fact_add(
        owner=alice, scope=end_user_ensure(owner=alice, external_id="u1"), dedup_threshold=1.01,
        facts=[FactIn(c, confidence=conf, observed_at=now - timedelta(days=days))
               for c, days, conf in FACTS],
    )  # fmt: skip
    return alice


def _ids(hits: list[dict[str, Any]]) -> list[str]:
    return [h["id"] for h in hits]


def _mcp(live_server: Any, key: str, query: str) -> list[str]:
    async def work(session: ClientSession) -> list[str]:
        found = await session.call_tool("search_memory", {"scope": SCOPE, "query": query})
        assert not found.is_error, found.content
        return _ids(found.structured_content["results"])

    return asyncio.run(_session(live_server.url + "/mcp", key, work))


def test_every_door_returns_the_same_facts_in_the_same_order(
    live_server, facts, llm_settings, openai_server
):
    alice = facts
    key = _key(alice)
    api = httpx.Client(timeout=30, base_url=live_server.url,
                       headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    openai_server.default_chat = Scripted(body=chat_body("ok"))
    for query in QUERIES:
        expected = fact_search(owner=alice, scope=tuple(SCOPE), query=query)
        want = [str(h.id) for h in expected.hits]
        assert len(want) == len(FACTS)  # min(limit, matching): every fact matches
        doors = {
            "users search (POST)": _ids(api.post(
                "/api/v1/users/u1/memories/search", json={"query": query}).json()["results"]),
            "users search (GET)": _ids(api.get(
                "/api/v1/users/u1/memories/search", params={"q": query}).json()["results"]),
            "engine search": _ids(api.post(
                "/api/v1/engine/search", json={"scope": SCOPE, "query": query}
            ).json()["results"]),
            "tools endpoint": _ids(api.post(
                "/api/v1/tools/search_memory/call",
                json={"scope": SCOPE, "arguments": {"query": query}},
            ).json()["result"]["results"]),
            "MCP": _mcp(live_server, key, query),
        }  # fmt: skip
        for door, got in doors.items():
            assert got == want, (door, query)
        # The chat proxy: the relevant facts first, most relevant first; then the search's
        # other hits with a query word or a similarity at the threshold, in its order;
        # then the rest by confidence (then newest), all marked not relevant.
        answer = api.post(
            "/v1/chat/completions", headers={"X-OpenWebUI-User-Id": "u1"},
            json={"model": "m", "messages": [{"role": "user", "content": query}]},
        ).json()  # fmt: skip
        memories = answer["memories"]
        relevant = [str(h.id) for h in relevant_hits(expected.hits)]
        assert relevant, query  # the test means something: some facts are relevant
        assert [m["id"] for m in memories if m["relevant"]] == relevant
        assert [m["id"] for m in memories[: len(relevant)]] == relevant
        matching = [str(h.id) for h in matching_hits(expected.hits) if str(h.id) not in relevant]
        after = len(relevant) + len(matching)
        assert [m["id"] for m in memories[len(relevant) : after]] == matching
        rest = [m for m in memories[after:]]
        assert not any(m["relevant"] for m in memories[len(relevant) :])
        by_conf = sorted(rest, key=lambda m: -m["confidence"])
        assert [m["id"] for m in rest] == [m["id"] for m in by_conf]
        scores = {str(h.id): h.score for h in expected.hits}
        for m in memories[: len(relevant)]:
            assert m["score"] == pytest.approx(scores[m["id"]], rel=1e-6)
        # ... and the block sent upstream lists them in that order.
        (sent,) = [
            r for r in openai_server.requests if r["json"]["messages"][-1]["content"] == query
        ]
        block = sent["json"]["messages"][0]["content"]
        lines = [line.split("] ", 1)[1] for line in block.splitlines() if line.startswith("- [")]
        contents = {str(h.id): h.content for h in expected.hits}
        assert lines == [contents[m["id"]] for m in memories]
        assert settings.MEMORY_PROMPT_MAX_TOKENS >= 100  # (the whole block fits here)


def test_the_get_search_refuses_a_filter_it_would_ignore(alice_client, facts):
    """GET took ?filter=garbage (or a real filter) and searched without it, where an
    unknown parameter is a 400: every memory matched what the caller meant to narrow."""
    for value in ("garbage", '{"category": "preference"}'):
        answer = alice_client.get("/api/v1/users/u1/memories/search", {"q": "x", "filter": value})
        assert answer.status_code == 400
        said = "the GET form takes no filter: POST the search"
        assert answer.json()["error"]["details"] == {"filter": [said]}
