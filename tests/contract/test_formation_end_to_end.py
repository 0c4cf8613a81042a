"""End to end through ``/v1/chat/completions`` on a live server: an upstream that answers
the extraction in a variant shape forms the memory; one that answers garbage leaves the
update ``malformed`` with the reason, visible in ``GET /api/v1/engine/updates`` and on
``/healthz``, and the next chat still answers."""

from __future__ import annotations

import httpx
import openai
import pytest

from core.services import api_key_create
from memories.engine.models import PendingUpdate
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_list
from tests.contract.corpus import GARBAGE, dumps
from tests.fakes.openai_server import Scripted, chat_body

pytestmark = pytest.mark.django_db(transaction=True)
TEA = "I drink green tea every morning."
FACT = "User drinks green tea every morning"


@pytest.fixture
def service(live_server, alice, llm_settings, openai_server, engine_storage):
    llm_settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 0  # formation runs once the answer is out
    extraction = {"answer": dumps({"memories": [FACT]})}  # a variant: other key, strings

    def respond(payload):
        prompt = "\n".join(str(m.get("content")) for m in payload["messages"])
        if "You maintain the long-term memory" in prompt:
            return Scripted(body=chat_body(extraction["answer"]))
        return Scripted(body=chat_body("Noted."))

    openai_server.chat_fn = respond
    key = api_key_create(owner=alice)[1]
    return live_server.url, key, extraction


def _chat(url: str, key: str, user: str, text: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0,
                           default_headers={"X-OpenWebUI-User-Id": user})  # fmt: skip
    answer = client.chat.completions.create(model="fake-model",
                                            messages=[{"role": "user", "content": text}])  # fmt: skip
    return answer.choices[0].message.content


def _updates(url: str, key: str, user: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/engine/updates", params={"scope": ["user", user]},
                         headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_a_variant_answer_forms_the_memory_and_garbage_shows_malformed(service, alice):
    url, key, extraction = service
    assert _chat(url, key, "ann", TEA) == "Noted."
    row = scope_find(owner=alice, scope=("user", "ann"))
    facts = [(f.content, f.category, f.confidence) for f in fact_list(scope=row)]
    assert facts == [(FACT, "context", 0.7)]
    (done,) = _updates(url, key, "ann")
    assert (done["status"], done["error"], done["answer_excerpt"]) == ("done", "", "")
    assert done["note"].startswith("1 facts read: 1 add; no confidence on 1: 0.70 used")

    extraction["answer"] = GARBAGE
    assert _chat(url, key, "bea", TEA) == "Noted."  # the chat is not held up by it
    (bad,) = _updates(url, key, "bea")
    assert (bad["status"], bad["error"], bad["answer_excerpt"]) == (
        "malformed", "no JSON in the answer", GARBAGE,
    )  # fmt: skip
    assert PendingUpdate.objects.get(pk=bad["id"]).messages[0]["content"] == TEA  # kept
    assert list(fact_list(scope=scope_find(owner=alice, scope=("user", "bea")))) == []
    health = httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {key}"},
                       timeout=30).json()["formation"]  # fmt: skip
    assert [(h["owner"], h["runs_24h"], h["malformed_24h"], h["bad_share_24h"], h["status"])
            for h in health] == [("alice", 2, 1, 0.5, "degraded")]  # fmt: skip
