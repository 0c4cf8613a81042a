"""The hand-written retrieval sets of bench/data, with the default offline embedder (the
local MiniLM), held to the figures BENCHMARKS.md records (issue 25):

- the personal-facts set through ``/v1/chat/completions``: each question asked by its end
  user, the fact it is about marked ``relevant``, few facts marked, on both halves (tuned
  on "tune", reported on "check");
- the document-base set through ``POST /api/v1/knowledge-bases/{id}/search``: ordinary
  documents without sessions, so a change tuned on conversations cannot cost them.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from memories.facts.scopes import end_user_ensure
from memories.facts.services import FactIn, fact_add
from tests.fakes.openai_server import Scripted, chat_body
from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db
DATA = Path(__file__).resolve().parent.parent / "bench" / "data"


@pytest.fixture
def minilm(settings):
    settings.EMBEDDING_PROVIDER = "local"
    settings.EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
    settings.EMBEDDING_DIMENSIONS = 384
    settings.MEMORY_SCORE_THRESHOLD = 0.2  # the local embedder's default
    return settings


def test_personal_facts_through_the_chat_proxy(alice, alice_client, minilm, llm_settings,
                                               openai_server):  # fmt: skip
    data = json.loads((DATA / "personal_facts_dev.json").read_text())
    keys = {}
    for user in data["users"]:
        scope = end_user_ensure(owner=alice, external_id=user["id"])
        facts = [FactIn(f["content"]) for f in user["facts"]]
        decisions = fact_add(owner=alice, scope=scope, facts=facts, dedup_threshold=1.01)
        assert [d.action for d in decisions] == ["add"] * len(facts)
        keys |= {str(d.fact_id): f["id"] for d, f in zip(decisions, user["facts"], strict=True)}
    assert len(keys) == 240
    openai_server.default_chat = Scripted(body=chat_body("ok"))
    rows = defaultdict(list)
    for user in data["users"]:
        for question in user["questions"]:
            response = alice_client.post(
                "/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": question["text"]}]},
                format="json",
                HTTP_X_OPENWEBUI_USER_ID=user["id"],
            )
            assert response.status_code == 200, response.content
            memories = response.json()["memories"]
            marked = [keys[m["id"]] for m in memories if m["relevant"]]
            # The relevant ones lead the block.
            assert [m["relevant"] for m in memories[: len(marked)]] == [True] * len(marked)
            rows[user["split"]].append((question["fact"] in marked, len(marked)))
    figures = {
        split: (statistics.fmean(m for m, _ in r), statistics.fmean(n for _, n in r))
        for split, r in rows.items()
    }
    # BENCHMARKS.md, "Retrieval quality, round two": tune 0.976 marked with 1.45 marked on
    # average, check 0.935 with 1.55 (before: 0.984 with 3.98, 0.927 with 3.61).
    assert figures["tune"][0] >= 0.97 and figures["tune"][1] <= 1.5, figures
    assert figures["check"][0] >= 0.93 and figures["check"][1] <= 1.6, figures


def _documents_search(kb, client, text: str) -> list[str]:
    response = client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/search", {"query": text, "top_k": 20}, format="json"
    )
    assert response.status_code == 200, response.content
    return [r["metadata"]["source_key"] for r in response.json()["results"]]


def test_document_base_set(alice, alice_client, minilm):
    data = json.loads((DATA / "document_base_dev.json").read_text())
    kb = make_kb(alice, name="intranet")
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents",
        {"documents": [{"text": d["text"], "source_key": d["key"]} for d in data["documents"]]},
        format="json",
    )
    assert response.status_code in (200, 201), response.content
    chunks = defaultdict(list)
    for key, text in kb.chunks.order_by("chunk_index").values_list("source_key", "text"):
        chunks[key.split("#")[0]].append((key, " ".join(text.split())))
    recalls = defaultdict(list)
    for question in data["questions"]:
        evidence = set()
        for answer in question["answers"]:
            wanted = question.get("answer_text") if len(chunks[answer]) > 1 else None
            held = [k for k, t in chunks[answer] if wanted and wanted in t]
            evidence |= set(held or [k for k, _ in chunks[answer]])
        found = _documents_search(kb, alice_client, question["text"])
        for k in (5, 10, 20):
            recalls[k].append(len(evidence & set(found[:k])) / len(evidence))
    figures = {k: round(statistics.fmean(v), 3) for k, v in recalls.items()}
    # BENCHMARKS.md: R@5 0.729, R@10 0.890, R@20 0.991 (before issue 25: 0.702, 0.899, 0.945).
    assert figures[5] >= 0.72 and figures[10] >= 0.88 and figures[20] >= 0.98, figures
