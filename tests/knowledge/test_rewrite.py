"""Opt-in query rewriting (knowledge/rewrite.py) through the search API, with the chat
LLM a scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from core.providers.json_answer import parse_json_object
from knowledge import rewrite
from knowledge.models import Chunk
from knowledge.rewrite import EXAMPLE_QUESTION, fuse_rankings, valid_queries
from knowledge.search import Hit
from tests.fakes.openai_server import Scripted, chat_body
from tests.knowledge.factories import ingest, make_kb

pytestmark = pytest.mark.django_db

DOCS = (
    ("crete", "We spent two weeks in Crete last summer"),
    ("holiday", "Where did you go on holiday this year?"),
    ("cat", "The cat sleeps on the sofa all day"),
)


@pytest.fixture
def kb(alice):
    kb = make_kb(alice)
    ingest(kb, *DOCS)
    return kb


def _search(client, kb, **body):
    return client.post(f"/api/v1/knowledge-bases/{kb.pk}/search", body, format="json")


def _texts(response) -> list[str]:
    return [r["text"] for r in response.json()["results"]]


def _answer(*queries: str) -> Scripted:
    return Scripted(body=chat_body(json.dumps({"queries": list(queries)})))


def test_rewritten_queries_are_searched_and_fused(alice_client, kb, llm_settings, openai_server):
    openai_server.push(_answer("Crete trip", "holiday destination"))
    response = _search(alice_client, kb, query="holiday", mode="keyword", rewrite=True)
    assert response.status_code == 200
    body = response.json()
    assert body["rewrite"] == {
        "queries": ["Crete trip", "holiday destination"],
        "model": "fake-model",
        "error": None,
    }
    # "holiday": the original finds it (1.0) and so does the 2nd rewrite (0.5 x 1.0);
    # "Crete": found by the 1st rewrite only (0.5 x its best, 1.0).
    assert _texts(response) == [DOCS[1][1], DOCS[0][1]]
    assert [r["score"] for r in body["results"]] == pytest.approx([1.5, 0.5])
    # The hit keeps its leg scores from the first search that found it.
    assert body["results"][0]["keyword_rank"] == 1 and body["results"][1]["keyword_rank"] == 1
    (sent,) = openai_server.requests
    messages = sent["json"]["messages"]
    assert sent["path"].endswith("/chat/completions")
    assert sent["json"]["model"] == "fake-model" and sent["json"]["temperature"] == 0
    assert messages[0]["role"] == "system" and '{"queries"' in messages[0]["content"]
    assert messages[1]["content"] == EXAMPLE_QUESTION
    assert messages[-1] == {"role": "user", "content": "holiday"}


def test_hybrid_rewrite_asks_the_chat_model(
    alice_client, kb, llm_settings, openai_server, monkeypatch
):
    monkeypatch.setattr(rewrite, "REWRITE_QUERIES", 1)
    openai_server.push(_answer("two weeks in Crete", "ignored: over the limit"))
    response = _search(alice_client, kb, query="holiday", rewrite=True, top_k=2)
    assert response.status_code == 200
    assert response.json()["rewrite"]["queries"] == ["two weeks in Crete"]
    assert len(response.json()["results"]) == 2
    assert openai_server.requests[0]["json"]["model"] == "fake-model"  # LLM_MODEL
    assert (
        "1 different short search queries"
        in (openai_server.requests[0]["json"]["messages"][0]["content"])
    )
    # Counted for the base's owner as query rewriting (issue 29).
    from core.models import UsageDay

    counted = UsageDay.objects.filter(owner=kb.owner).values_list("kind", "model", "calls")
    assert list(counted) == [("query_rewrite", "fake-model", 1)]


def test_without_an_llm_it_is_503_naming_llm_base_url(alice_client, kb, settings):
    settings.LLM_BASE_URL = ""
    before = Chunk.objects.count()
    response = _search(alice_client, kb, query="holiday", rewrite=True)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "not_configured"
    assert error["details"] == {"variable": "LLM_BASE_URL"}
    assert "Query rewriting" in error["message"]
    assert Chunk.objects.count() == before
    # Not asked for: the search runs as ever.
    assert _texts(_search(alice_client, kb, query="holiday", mode="keyword")) == [DOCS[1][1]]


def test_a_search_that_does_not_ask_is_not_rewritten(alice_client, kb, llm_settings, openai_server):
    openai_server.push(_answer("Crete"))
    for asked in ({}, {"rewrite": False}, {"rewrite": None}):  # an LLM is configured
        response = _search(alice_client, kb, query="holiday", mode="keyword", **asked)
        assert "rewrite" not in response.json() and _texts(response) == [DOCS[1][1]]
    assert openai_server.requests == []  # the LLM was asked nothing
    response = _search(alice_client, kb, query="holiday", mode="keyword", rewrite=True)
    assert response.json()["rewrite"]["queries"] == ["Crete"]
    assert _texts(response) == [DOCS[1][1], DOCS[0][1]]
    # No LLM: a search that does not ask is answered as ever.
    llm_settings.LLM_BASE_URL = ""
    assert _texts(_search(alice_client, kb, query="holiday", mode="keyword")) == [DOCS[1][1]]


def test_malformed_json_is_repaired_by_one_more_ask(alice_client, kb, llm_settings, openai_server):
    openai_server.push(
        Scripted(body=chat_body("Here are some queries: Crete trip, holidays")),
        Scripted(body=chat_body('```json\n{"queries": ["Crete trip",],}\n```')),
    )
    response = _search(alice_client, kb, query="holiday", mode="keyword", rewrite=True)
    assert response.json()["rewrite"]["queries"] == ["Crete trip"]
    assert len(openai_server.requests) == 2
    assert openai_server.requests[1]["json"]["messages"][-1]["content"].startswith(
        "Your previous answer was not valid JSON"
    )


@pytest.mark.parametrize(
    ("scripted", "error"),
    [
        ([Scripted(status=400, body={"error": {"message": "bad model"}})], "answered 400"),
        ([Scripted(body=chat_body("no")), Scripted(body=chat_body("still no"))], "not JSON"),
        ([_answer("holiday", "  HOLIDAY ", "", "?!")], "no usable query"),
        # (a string for the list is one query: tests/contract/test_llm_answers.py)
        ([Scripted(body=chat_body('{"queries": []}'))], "no usable query"),
        ([Scripted(body={"choices": []})], "no message content"),
    ],
)
def test_an_llm_failure_searches_as_asked(
    alice_client, kb, llm_settings, openai_server, scripted, error
):
    openai_server.push(*scripted)
    plain = _texts(_search(alice_client, kb, query="holiday", mode="keyword"))
    response = _search(alice_client, kb, query="holiday", mode="keyword", rewrite=True)
    assert response.status_code == 200
    assert _texts(response) == plain == [DOCS[1][1]]
    rewrite = response.json()["rewrite"]
    assert rewrite["queries"] == [] and error in rewrite["error"]


def test_an_llm_timeout_searches_as_asked(alice_client, kb, llm_settings, openai_server):
    llm_settings.SEARCH_REWRITE_TIMEOUT = 0.3
    llm_settings.LLM_MAX_RETRIES = 0
    openai_server.push(Scripted(body=chat_body('{"queries": ["Crete"]}'), delay=1.5))
    response = _search(alice_client, kb, query="holiday", mode="keyword", rewrite=True)
    assert response.status_code == 200
    assert _texts(response) == [DOCS[1][1]]
    assert "timed out" in response.json()["rewrite"]["error"]


def test_bad_input_and_other_tenants(alice_client, bob_client, kb, llm_settings, openai_server):
    for body in (
        {"vector": [0.1] * 384, "rewrite": True},
        {"query": "holiday", "rewrite": "yes"},
        {"query": "holiday", "rewrite": 1},
    ):
        response = _search(alice_client, kb, **body)
        assert response.status_code == 400, body
        assert set(response.json()["error"]) == {"code", "message", "details"}
    assert _search(bob_client, kb, query="holiday", rewrite=True).status_code == 404
    assert openai_server.requests == []


def test_multi_base_search_rewrites(alice, alice_client, kb, llm_settings, openai_server):
    other = make_kb(alice, name="other")
    ingest(other, ("trip", "Our trip to Crete was sunny"))
    openai_server.push(_answer("Crete"))
    response = alice_client.post(
        "/api/v1/search",
        {"query": "holiday", "mode": "keyword", "rewrite": True},
        format="json",
    )
    assert response.status_code == 200
    assert sorted(_texts(response)) == sorted(
        [DOCS[1][1], DOCS[0][1], "Our trip to Crete was sunny"]
    )


def test_valid_queries():
    raw = ["  Crete   trip ", "crete trip", "Holiday", "", "x" * 501, 3, None, "a", "b"]
    assert valid_queries(raw, "holiday", 3) == ["Crete trip", "a", "b"]
    assert valid_queries("Crete", "holiday", 3) == []
    assert valid_queries(["a", "b"], "q", 1) == ["a"]


def test_fuse_rankings_weights_and_order():
    def hit(cid: int, score: float) -> Hit:
        return Hit(chunk_id=cid, knowledge_base_id="kb", score=score, text=str(cid))

    fused = fuse_rankings(
        [(1.0, [hit(1, 2.0), hit(2, 1.0)]), (0.5, [hit(3, 4.0), hit(2, 4.0)]), (0.5, [])], 3
    )
    # 1: 1.0 x 2/2; 2: 1.0 x 1/2 + 0.5 x 4/4 (a tie with 1, which ranked first); 3: 0.5 x 1.
    assert [(h.chunk_id, h.score) for h in fused] == [(1, 1.0), (2, 1.0), (3, 0.5)]
    # Non-positive best scores count by rank.
    fused = fuse_rankings([(1.0, [hit(1, 0.0), hit(2, -1.0)])], 5)
    assert [(h.chunk_id, h.score) for h in fused] == [(1, 1.0), (2, 0.5)]


def test_parse_json_object_takes_a_bare_list_under_its_key():
    assert parse_json_object('Sure: ["a", "b"]', list_key="queries") == {"queries": ["a", "b"]}
    assert parse_json_object('{"queries": ["a"]}', list_key="queries") == {"queries": ["a"]}
    assert parse_json_object("none", list_key="queries") is None
    # A model that keeps writing after its answer: the first object.
    chatty = '{"queries": ["a"]} and more\n{"queries": ["b"]} {"queries":'
    assert parse_json_object(chatty, list_key="queries") == {"queries": ["a"]}
