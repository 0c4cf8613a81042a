"""The engine's JSON calls (``memories.engine.llm.json_calls``, what the extraction and the
dreams ask through): a malformed answer is repaired, or asked again once, then given up
without raising, logged and counted; every call and its tokens are counted. (The tests
of the per-message formation asserted this of the same calls, which it shared.)"""

from __future__ import annotations

import json
import logging

import pytest

from core.models import MetricCounter
from core.providers.json_answer import parse_json_object
from memories.engine.llm import json_calls
from tests.fakes.openai_server import Scripted, chat_body

pytestmark = pytest.mark.django_db
ASK = [{"role": "system", "content": "Extract the facts."}]
USAGE = {"prompt_tokens": 200, "completion_tokens": 20, "total_tokens": 220}


def _counter(name: str) -> int:
    return MetricCounter.objects.filter(name=name).values_list("value", flat=True).first() or 0


def test_a_malformed_answer_is_repaired(llm_settings, openai_server):
    openai_server.push(Scripted(body=chat_body(
        'Sure! Here you go:\n```json\n{"memories": ["User has a dog named Rex",]}\n```',
        usage=USAGE)))  # fmt: skip
    calls = json_calls(None, feature="Extraction")
    assert calls.json(ASK, what="extraction") == {"memories": ["User has a dog named Rex"]}
    assert (len(openai_server.requests), calls.count, calls.tokens) == (1, 1, 220)


def test_malformed_twice_is_asked_once_more_then_given_up(llm_settings, openai_server, caplog):
    openai_server.push(
        Scripted(body=chat_body("I cannot do that")), Scripted(body=chat_body("still not json"))
    )
    calls = json_calls(None, feature="Extraction")
    with caplog.at_level(logging.INFO, logger="memories.decisions"):
        assert calls.json(ASK, what="extraction") is None
    assert len(openai_server.requests) == 2 and calls.count == 2
    assert openai_server.requests[1]["json"]["messages"][-1]["content"].startswith(
        "Your previous answer was not valid JSON"
    )
    malformed = [
        json.loads(r.message) for r in caplog.records if "memory_llm_malformed_json" in r.message
    ]
    assert [m["attempt"] for m in malformed] == [1, 2]
    assert _counter("engine_llm_malformed_total") == 1


def test_the_second_ask_can_fix_it(llm_settings, openai_server):
    openai_server.push(
        Scripted(body=chat_body("not json")),
        Scripted(body=chat_body('{"memories": ["User has a dog named Rex"]}')),
    )
    calls = json_calls(None, feature="Extraction")
    assert calls.json(ASK, what="extraction") == {"memories": ["User has a dog named Rex"]}
    assert _counter("engine_llm_malformed_total") == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"memories": ["a"]}', {"memories": ["a"]}),
        ('```json\n{"memories": ["a"]}\n```', {"memories": ["a"]}),
        ('Here: {"memories": ["a", "b",],}', {"memories": ["a", "b"]}),
        ('["a", "b"]', {"memories": ["a", "b"]}),
        ("no json here", None),
        ("", None),
    ],
)
def test_parse_json_object(text, expected):
    assert parse_json_object(text, list_key="memories") == expected
