"""The demo model (``scripts/openwebui/demo_llm.py``) and the test suite's scripted
upstreams answer the prompts as the code builds them: each prompt is rendered by the
code that sends it, fed to them, and their answer read by the code that reads it. A
prompt change they no longer follow fails here."""

from __future__ import annotations

import importlib.util
import json
from datetime import date
from pathlib import Path

import pytest

from core.providers.json_answer import read_answer, read_text
from ingestion.updates import EXTRACTION, extraction_prompt, parse_extraction
from knowledge.rewrite import REWRITE, rewrite_messages
from memories.conversations.summaries import SummaryMessage, summary_messages
from memories.engine.dreams import DREAM, dream_inputs, dream_messages
from memories.engine.updates import update_record
from memories.facts.scopes import scope_find
from memories.facts.services import FactIn, fact_add
from tests.memories.engine.scripted import EngineLLM, fact
from tests.memories.facts.conftest import scripted_llm

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
TEA = "I drink green tea every morning."
SCOPE = ("user", "alice")


def _demo():
    spec = importlib.util.spec_from_file_location(
        "demo_llm", ROOT / "scripts/openwebui/demo_llm.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _demo()


def _scripted_text(scripted) -> str:
    return scripted.body["choices"][0]["message"]["content"]


@pytest.fixture
def extraction(alice):
    update = update_record(owner=alice, scope=SCOPE, require_llm=False,
                           messages=[{"role": "user", "content": TEA, "id": "m-1"}])  # fmt: skip
    scope = scope_find(owner=alice, scope=SCOPE)
    fact_add(owner=alice, scope=scope, reason="test",
                  facts=[FactIn(content="User is learning Rust", category="goal", confidence=0.9)])  # fmt: skip
    return extraction_prompt(scope, [update])


def test_the_demo_model_understands_the_extraction_prompt(extraction):
    assert demo.prompt_kind(extraction.messages) == "extraction"
    text = demo.answer({"messages": extraction.messages})
    reading = read_answer(text, EXTRACTION, source=extraction.conversation)
    assert reading.status == "ok" and reading.notes == []  # the documented shape, as it is
    got = parse_extraction(reading.value, extraction.known, extraction.refs)
    assert [(f.content, f.category, f.confidence, f.source_ref) for f in got.facts] == [
        ("User drinks green tea every morning", "context", 0.9, "m-1")
    ]


def test_the_demo_model_does_not_repeat_a_current_fact(alice):
    update = update_record(owner=alice, scope=SCOPE, messages=[{"role": "user", "content": TEA}],
                           require_llm=False)  # fmt: skip
    scope = scope_find(owner=alice, scope=SCOPE)
    fact_add(owner=alice, scope=scope, reason="test", facts=[
        FactIn(content="User drinks green tea every morning", category="context", confidence=0.9)])  # fmt: skip
    prompt = extraction_prompt(scope, [update])
    reading = read_answer(demo.answer({"messages": prompt.messages}), EXTRACTION)
    assert reading.status == "empty"


def test_the_scripted_upstreams_understand_the_extraction_prompt(extraction):
    payload = {"messages": extraction.messages}
    engine = EngineLLM({TEA: [fact("User drinks green tea every morning")]})
    reading = read_answer(_scripted_text(engine(payload)), EXTRACTION)
    assert engine.calls["extraction"] == 1 and len(reading.value["newFacts"]) == 1
    personal = scripted_llm({TEA: ["User drinks green tea every morning"]})
    reading = read_answer(_scripted_text(personal(payload)), EXTRACTION)
    assert [f["content"] for f in reading.value["newFacts"]] == [
        "User drinks green tea every morning"
    ]


def test_the_demo_model_understands_the_dream_prompt(alice, extraction):
    scope = scope_find(owner=alice, scope=SCOPE)
    inputs = dream_inputs(scope, lookback=3, today=date.today())
    messages = dream_messages(scope, inputs, 3)
    assert demo.prompt_kind(messages) == "dream"
    reading = read_answer(demo.answer({"messages": messages}), DREAM)
    assert reading.status == "ok" and reading.notes == []
    assert [
        (f["id"], f["content"], f["category"], f["confidence"]) for f in reading.value["facts"]
    ] == [
        (inputs.facts[0]["id"], "User is learning Rust", "goal", 0.9)
    ]  # kept as it was: the dream changes nothing
    engine = EngineLLM()
    engine({"messages": messages})
    assert engine.calls["dream"] == 1


@pytest.mark.parametrize("earlier", ["", "Alice likes tea."], ids=["first", "extend"])
def test_the_demo_model_understands_the_summary_prompts(earlier):
    messages = summary_messages(earlier, [SummaryMessage("m1", "user", TEA),
                                          SummaryMessage("m2", "assistant", "Noted!")])  # fmt: skip
    assert demo.prompt_kind(messages) == "summary"
    reading = read_text(demo.answer({"messages": messages}))
    assert reading.text == "Summary: user: I drink green tea every morning.; assistant: Noted!"
    engine = EngineLLM()
    engine({"messages": messages})
    assert engine.calls["summary"] == 1


def test_the_demo_model_understands_the_rewrite_prompt():
    messages = rewrite_messages("Where did Alice go on holiday?", 3)
    assert demo.prompt_kind(messages) == "rewrite"
    reading = read_answer(demo.answer({"messages": messages}), REWRITE)
    assert reading.value == {"queries": ["Where did Alice go on holiday", "Alice go on holiday"]}


def test_a_chat_quotes_the_memory_block():
    system = "Memories:\n- [context | 0.90] User drinks green tea every morning"
    reply = demo.answer({"messages": [{"role": "system", "content": system},
                                      {"role": "user", "content": "What do I drink?"}]})  # fmt: skip
    assert reply == ("(demo model) You said: What do I drink? | I remember: [context | 0.90] "
                     "User drinks green tea every morning")  # fmt: skip
    assert json.loads(json.dumps(reply)) == reply
