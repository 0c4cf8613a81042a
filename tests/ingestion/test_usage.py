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
        # (a dream's tokens count against the budget; summaries' do not)
        "budget": {"daily_tokens": None, "spent_today": 180, "resets_at": body["budget"]["resets_at"],
                   "deferred_runs_today": 0, "last_deferred_at": None},
    }  # fmt: skip
    assert body["budget"]["resets_at"] == f"{today + timedelta(days=1)}T00:00:00Z"
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


# --- budgets ---------------------------------------------------------------------------
@pytest.fixture
def noon(monkeypatch):
    """The clock of the usage counts at noon today (UTC), so a test cannot cross midnight."""
    from core import usage

    fixed = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0)
    monkeypatch.setattr(usage, "timezone", type("Clock", (), {"now": staticmethod(lambda: fixed)}))
    return fixed


def _flush(owner, text, at):
    return update_record(owner=owner, scope=("user", "alice"),
                         messages=[{"role": "user", "content": text}], now=at)  # fmt: skip


def test_a_spent_budget_defers_extraction_and_loses_nothing(alice, alice_client, engine_llm,
                                                            noon, settings):  # fmt: skip
    from django_q.models import Schedule

    from memories.engine.models import PendingUpdate
    from memories.engine.updates import schedule_name
    from memories.facts.models import Fact
    from tests.ingestion.conftest import DARK, RUST

    response = alice_client.patch("/api/v1/me", {"background_daily_tokens": 20}, format="json")
    assert response.json()["background_daily_tokens"] == 20
    runs = []
    for i, text in enumerate([TEA, RUST, DARK]):
        update = _flush(alice, text, noon + timedelta(minutes=i))
        runs.append(
            updates_run(scope_id=update.scope_id, now=noon + timedelta(minutes=i, seconds=31))
        )
    # Each extraction spends 15 tokens (10 in, 5 out): the third finds 30 of 20 spent.
    assert [r.status for r in runs] == ["done", "done", "deferred"]
    assert engine_llm.calls["extraction"] == 2
    midnight = noon.replace(hour=0) + timedelta(days=1)
    waiting = PendingUpdate.objects.get(pk__in=runs[2].updates)
    assert (waiting.status, waiting.due_at) == (PendingUpdate.Status.PENDING, midnight)
    assert Schedule.objects.get(name=schedule_name(waiting.scope_id)).next_run == midnight
    budget = alice_client.get("/api/v1/usage").json()["budget"]
    assert (budget["daily_tokens"], budget["spent_today"], budget["deferred_runs_today"]) == (
        20,
        30,
        1,
    )
    # The chat proxy's own answers are never held back.
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 30
    reply = alice_client.post("/v1/chat/completions",
                              {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                              format="json", HTTP_X_OPENWEBUI_USER_ID="alice")  # fmt: skip
    assert reply.status_code == 200
    # After the reset the deferred flush runs, and what it said is learned.
    later = updates_run(scope_id=waiting.scope_id, now=midnight + timedelta(seconds=1))
    assert later.status == "done" and waiting.pk in later.updates
    assert Fact.objects.filter(owner=alice, content="User prefers dark mode").exists()
    waiting.refresh_from_db()
    assert waiting.status == PendingUpdate.Status.DONE


def test_a_spent_budget_defers_the_scheduled_dream(alice, noon, settings):
    from memories.engine.dreams import dream_scheduled
    from memories.engine.models import Dream
    from memories.facts.scopes import scope_ensure

    settings.USAGE_DAILY_TOKEN_BUDGET = 100  # the deployment's default
    scope = scope_ensure(owner=alice, scope=("user", "alice"))
    with usage_for(owner_id=alice.pk, kind="extraction"):
        usage_record(model="m", tokens_in=90, tokens_out=10, estimated=False)
    assert dream_scheduled(scope_id=scope.pk, day=noon.date()) == "deferred"
    assert not Dream.objects.filter(scope=scope).exists()


@pytest.mark.parametrize("value", [-5, "many", 1.5, None])
def test_a_bad_budget_is_refused_and_changes_nothing(alice, alice_client, value):
    alice_client.patch("/api/v1/me", {"background_daily_tokens": 7}, format="json")
    body = {} if value is None else {"background_daily_tokens": value}
    response = alice_client.patch("/api/v1/me", body, format="json")
    assert response.status_code == 400, response.content
    assert "background_daily_tokens" in response.json()["error"]["details"]
    assert alice_client.get("/api/v1/me").json()["background_daily_tokens"] == 7


def test_a_count_made_while_the_connection_is_busy_waits_for_the_next(alice):
    """A count made while this thread's connection is in a call (a stream's finaliser run
    by the garbage collector inside a query) must not wait for the connection's own lock:
    it is kept, and written with the next count."""
    from django.db import connection

    connection.ensure_connection()
    with usage_for(owner_id=alice.pk, kind="dream"):
        with connection.connection.lock:  # as psycopg holds it during a call
            usage_record(model="m", tokens_in=5, tokens_out=1, estimated=False)
        assert not UsageDay.objects.filter(owner=alice).exists()
        usage_record(model="m", tokens_in=7, tokens_out=2, estimated=False)
    assert _rows(alice) == [("dream", "m", "", 2, 12, 3, 0)]


def test_a_spent_budget_defers_memory_base_preprocessing_and_loses_nothing(
    alice, alice_client, flow, llm_settings, openai_server, noon
):
    from django.db.models import F
    from django_q.models import Schedule

    from core.usage import budget_set
    from ingestion.memory_bases import memory_base_jobs_sweep, session_ingest_run
    from knowledge.models import Chunk
    from memories.bases import services
    from memories.bases.models import MemoryBaseJob, MemoryBaseSession
    from tests.conftest import record

    mb = services.memory_base_create(owner=alice, name="distilled", flow=flow, threshold=100,
                                     preprocess=True)  # fmt: skip
    budget_set(owner_id=alice.pk, daily_tokens=20)
    with usage_for(owner_id=alice.pk, kind="extraction"):
        usage_record(model="m", tokens_in=15, tokens_out=10, estimated=False)  # 25 of 20
    record(flow, "s1", "I like dark mode", "Noted!")
    session = MemoryBaseSession.objects.get(memory_base=mb, session_id="s1")
    job = services.session_ingest_enqueue(session=session, trigger=MemoryBaseJob.Trigger.AUTO)
    assert session_ingest_run(job_id=job.pk).status == MemoryBaseJob.Status.QUEUED
    midnight = noon.replace(hour=0) + timedelta(days=1)
    job.refresh_from_db()
    # Back in the queue, the claim not counted, nothing asked of the LLM, nothing written.
    assert (job.status, job.attempts, job.deferred_until) == ("queued", 0, midnight)
    assert openai_server.requests == [] and not Chunk.objects.filter(
        knowledge_base=mb.knowledge_base
    )
    session.refresh_from_db()
    assert session.total_processed == 0
    scheduled = Schedule.objects.get(name=f"memory-base-job:{job.pk}")
    assert (scheduled.func, scheduled.next_run) == ("ingestion.tasks.ingest_session", midnight)
    assert memory_base_jobs_sweep(stale_seconds=0) == 0  # left be until the reset
    shown = alice_client.get(f"/api/v1/jobs/{job.pk}").json()
    assert (shown["status"], shown["deferred_until"]) == (
        "queued",
        midnight.isoformat().replace("+00:00", "Z"),
    )
    assert alice_client.get("/api/v1/usage").json()["budget"]["deferred_runs_today"] == 1

    # The next day (today's spending is yesterday's): it runs, and what it said is kept.
    UsageDay.objects.filter(owner=alice).update(day=F("day") - 1)
    openai_server.push(Scripted(body=chat_body("User prefers dark mode.")))
    assert session_ingest_run(job_id=job.pk).status == MemoryBaseJob.Status.SUCCEEDED
    job.refresh_from_db()
    assert job.attempts == 1
    assert list(
        Chunk.objects.filter(knowledge_base=mb.knowledge_base).values_list("text", flat=True)
    ) == ["User prefers dark mode."]


def test_a_memory_base_job_a_caller_asked_for_is_never_held(alice, flow, llm_settings, openai_server,
                                                            noon):  # fmt: skip
    from core.usage import budget_set
    from ingestion.memory_bases import session_ingest_run
    from memories.bases import services
    from memories.bases.models import MemoryBaseJob, MemoryBaseSession
    from tests.conftest import record

    mb = services.memory_base_create(owner=alice, name="distilled", flow=flow, threshold=100,
                                     preprocess=True)  # fmt: skip
    budget_set(owner_id=alice.pk, daily_tokens=1)
    with usage_for(owner_id=alice.pk, kind="dream"):
        usage_record(model="m", tokens_in=5, tokens_out=5, estimated=False)
    record(flow, "s1", "I like dark mode")
    session = MemoryBaseSession.objects.get(memory_base=mb, session_id="s1")
    job = services.session_ingest_enqueue(session=session, trigger=MemoryBaseJob.Trigger.MANUAL)
    openai_server.push(Scripted(body=chat_body("User prefers dark mode.")))
    done = session_ingest_run(job_id=job.pk)
    assert (done.status, done.deferred_until) == (MemoryBaseJob.Status.SUCCEEDED, None)
    assert len(openai_server.requests) == 1


def test_erasing_an_end_user_keeps_their_usage_counts_but_not_their_id(
    alice, bob, alice_client, engine_llm
):
    """The usage rows about an erased end user (their id is the subject) are merged into
    the owner's anonymous ``(erased)`` rows: the bill stays, the id goes; another end
    user's rows and another owner's rows of the same id are untouched."""
    from memories.facts.scopes import end_user_ensure

    gone, kept = "mail.x1@example.com", "mail.x2@example.com"
    for owner, user in ((alice, gone), (alice, kept), (bob, gone)):
        end_user_ensure(owner=owner, external_id=user)
        for kind, tokens in (("proxy", 100), ("extraction", 10)):
            with usage_for(owner_id=owner.pk, kind=kind, subject=f"user/{user}"):
                usage_record(model="m", tokens_in=tokens, tokens_out=1, estimated=False)
    with usage_for(owner_id=alice.pk, kind="proxy", subject="(erased)"):  # an earlier erasure's
        usage_record(model="m", tokens_in=1000, tokens_out=1, estimated=True)
    totals = alice_client.get("/api/v1/usage", {"group_by": "kind"}).json()["totals"]

    assert alice_client.delete(f"/api/v1/users/{gone}/memories").status_code == 200

    assert _rows(alice) == [
        ("extraction", "m", "(erased)", 1, 10, 1, 0),
        ("extraction", "m", f"user/{kept}", 1, 10, 1, 0),
        ("proxy", "m", "(erased)", 2, 1100, 2, 1),
        ("proxy", "m", f"user/{kept}", 1, 100, 1, 0),
    ]
    by_subject = alice_client.get("/api/v1/usage", {"group_by": "subject"}).json()
    assert gone not in str(by_subject) and by_subject["totals"] == totals
    assert [row[2] for row in _rows(bob)] == [f"user/{gone}"] * 2
