"""Usage accounting (issue 29): every LLM call the service makes is counted for the
owner, day, kind of work, model and end user it served, from the provider's ``usage``
or counted with the tokenizer (estimated); ``GET /api/v1/usage`` shows the caller's own;
/metrics exports the totals by kind and model."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.models import UsageDay, UsageTotal
from core.providers.tokens import count_tokens
from core.usage import usage_for, usage_record
from ingestion.updates import updates_run
from memories.engine.updates import update_record
from tests.fakes.openai_server import Scripted, chat_body, chat_chunks
from tests.ingestion.conftest import TEA

pytestmark = pytest.mark.django_db


def _rows(owner) -> list[tuple]:
    return sorted(
        UsageDay.objects.filter(owner=owner).values_list(
            "kind", "model", "subject", "calls", "tokens_in", "tokens_out", "estimated_calls"
        )
    )


def test_an_extraction_is_counted_for_its_owner_and_end_user(alice, bob, engine_llm):
    t0 = timezone.now()
    update = update_record(owner=alice, scope=("user", "alice"),
                           messages=[{"role": "user", "content": TEA}], now=t0)  # fmt: skip
    run = updates_run(scope_id=update.scope_id, now=t0 + timedelta(seconds=30))
    assert (run.status, run.llm_calls) == ("done", 1)
    # The fake answers with usage 10 in, 5 out.
    assert _rows(alice) == [("extraction", "fake-model", "user/alice", 1, 10, 5, 0)]
    assert UsageDay.objects.get(owner=alice).day == timezone.now().date()
    assert _rows(bob) == []
    total = UsageTotal.objects.get(kind="extraction")
    assert (total.model, total.calls, total.tokens_in, total.tokens_out) == ("fake-model", 1, 10, 5)


def test_the_chat_proxy_counts_its_upstream_answers(alice, alice_client, llm_settings,
                                                    openai_server):  # fmt: skip
    messages = [{"role": "user", "content": "Hello there, how are you today?"}]
    openai_server.queue.append(Scripted(body=chat_body("Fine, thanks.")))
    response = alice_client.post("/v1/chat/completions", {"model": "m", "messages": messages},
                                 format="json", HTTP_X_OPENWEBUI_USER_ID="u1")  # fmt: skip
    assert response.status_code == 200
    # A stream without a usage chunk: counted with the tokenizer, marked estimated.
    openai_server.queue.append(Scripted(stream_chunks=chat_chunks(["Fine", ", thanks."])))
    response = alice_client.post(
        "/v1/chat/completions", {"model": "m", "messages": messages, "stream": True},
        format="json", HTTP_X_OPENWEBUI_USER_ID="u1",
    )  # fmt: skip
    assert response.status_code == 200
    b"".join(response.streaming_content)  # the stream is counted when it ends
    tokens_in = count_tokens(messages[0]["content"])
    assert _rows(alice) == [
        ("proxy", "fake-model", "user/u1", 2, 10 + tokens_in, 5 + count_tokens("Fine, thanks."), 1)
    ]


def test_usage_api_answers_the_callers_own_grouped_as_asked(alice, bob, alice_client):
    today = timezone.now().date()
    with usage_for(owner_id=alice.pk, kind="dream", subject="user/a"):
        usage_record(model="m1", tokens_in=100, tokens_out=20, estimated=False)
        usage_record(model="m2", tokens_in=50, tokens_out=10, estimated=True)
    with usage_for(owner_id=alice.pk, kind="summary", subject="user/b"):
        usage_record(model="m1", tokens_in=7, tokens_out=3, estimated=False)
    with usage_for(owner_id=bob.pk, kind="dream"):
        usage_record(model="m1", tokens_in=999, tokens_out=999, estimated=False)
    UsageDay.objects.create(owner=alice, day=today - timedelta(days=40), kind="dream",
                            model="m1", calls=1, tokens_in=1000, tokens_out=1)  # fmt: skip
    body = alice_client.get("/api/v1/usage").json()
    assert body == {
        "from": str(today - timedelta(days=29)), "to": str(today), "group_by": ["day", "kind"],
        "totals": {"calls": 3, "tokens_in": 157, "tokens_out": 33, "estimated_calls": 1},
        "results": [
            {"day": str(today), "kind": "dream", "calls": 2, "tokens_in": 150, "tokens_out": 30,
             "estimated_calls": 1},
            {"day": str(today), "kind": "summary", "calls": 1, "tokens_in": 7, "tokens_out": 3,
             "estimated_calls": 0},
        ],
    }  # fmt: skip
    by_subject = alice_client.get("/api/v1/usage", {"group_by": "subject,model"}).json()
    assert [(r["subject"], r["model"], r["tokens_in"]) for r in by_subject["results"]] == [
        ("user/a", "m1", 100), ("user/a", "m2", 50), ("user/b", "m1", 7),
    ]  # fmt: skip
    older = alice_client.get("/api/v1/usage", {"from": str(today - timedelta(days=60)),
                                               "to": str(today - timedelta(days=1)),
                                               "group_by": "kind"}).json()  # fmt: skip
    assert older["results"] == [
        {"kind": "dream", "calls": 1, "tokens_in": 1000, "tokens_out": 1, "estimated_calls": 0}
    ]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"from": "2026-02-10", "to": "2026-02-01"}, "from"),
        ({"from": "2024-01-01", "to": "2026-01-01"}, "from"),
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01"}, "to"),
        ({"group_by": "owner"}, "group_by"),
        ({"group_by": "day,day"}, "group_by"),
        ({"group_by": ""}, "group_by"),
    ],
)
def test_usage_api_refuses_bad_queries(alice_client, query, field):
    response = alice_client.get("/api/v1/usage", query)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"]["code"] == "invalid" and field in body["error"]["details"]


def test_metrics_export_usage_by_kind_and_model(alice, client, settings):
    settings.METRICS_TOKEN = "scrape"
    with usage_for(owner_id=alice.pk, kind="extraction", subject="user/a"):
        usage_record(model='m "x"', tokens_in=12, tokens_out=4, estimated=True)
    usage_record(model="m1", tokens_in=3, tokens_out=0, estimated=False)  # no work named
    assert not UsageDay.objects.filter(kind="other").exists()  # (no owner: the total only)
    body = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape").content.decode()
    assert 'memory_usage_tokens_in_total{kind="extraction",model="m \\"x\\""} 12' in body
    assert 'memory_usage_estimated_calls_total{kind="extraction",model="m \\"x\\""} 1' in body
    assert 'memory_usage_calls_total{kind="other",model="m1"} 1' in body
    assert "owner" not in body.split("memory_usage_calls_total", 1)[1]
