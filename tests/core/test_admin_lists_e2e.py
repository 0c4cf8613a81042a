"""The admin's widest lists fit a 1440 px window (issue 26): knowledge bases, the engine's
pending updates, the chunk browser (content-addressed ``sha256:`` keys included) and the
usage lists (issue 29), in
headless Chromium; no horizontal scroll of the page or of the result table. Screenshots
land in test-artifacts/."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from core.audit import Actor, acting_as
from core.models import UsageBudget
from core.services import api_key_create, api_key_revoke
from core.usage import budget_set, usage_for, usage_record
from knowledge.services import DocumentIn, knowledge_documents_submit
from knowledge.services.bases import knowledge_base_create
from memories.bases.models import MemoryBaseJob, MemoryBaseSession
from memories.bases.services import session_ingest_enqueue
from memories.engine.updates import update_record
from memories.facts.scopes import scope_ensure
from memories.facts.services import scope_erase
from tests.browser import fits_the_window, login, shot
from tests.conftest import record

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_widest_lists_fit_the_window(browser, live_server, alice, llm_settings, memory_base):
    kb = knowledge_base_create(owner=alice, name="the company handbook, every policy")
    knowledge_documents_submit(knowledge_base=kb, background=False, documents=[
        DocumentIn.from_payload(text=text, source_key="sha256:" + hashlib.sha256(text.encode()).hexdigest())
        for text in (f"Policy {n}: refunds within ten days, support on weekdays." for n in range(3))
    ])  # fmt: skip
    for user in ("gina", "a-rather-long-end-user-identifier-from-the-application"):
        update_record(owner=alice, scope=["user", user],
                      messages=[{"role": "user", "content": "I like tea"}])  # fmt: skip
    # Usage (issue 29): a long model name and a long end user, a budget with a deferral.
    long_user = "user/a-rather-long-end-user-identifier-from-the-application"
    for kind, model in (("extraction", "gpt-4o-mini-2024-07-18"), ("proxy", "fake-model")):
        with usage_for(owner_id=alice.pk, kind=kind, subject=long_user):
            usage_record(model=model, tokens_in=123456, tokens_out=7890, estimated=False)
    budget_set(owner_id=alice.pk, daily_tokens=200000)
    UsageBudget.objects.filter(owner=alice).update(deferred_at=timezone.now(), deferred_runs=3)
    # Keys (issue 30): a read-only one that expires, revoked from a key; an erasure.
    reader, _ = api_key_create(owner=alice, name="browser extension", read_only=True,
                               expires_at=timezone.now() + timedelta(days=30))  # fmt: skip
    with acting_as(Actor("key:mem_abcdefgh", None, "203.0.113.7")):
        api_key_revoke(api_key=reader)
        scope_erase(scope=scope_ensure(owner=alice, scope=("user", "gina")))
    # A Memory Base job deferred by the budget (issue 29), never run here.
    record(memory_base.flow, "chat-with-a-rather-long-session-identifier", "Noted!")
    session = MemoryBaseSession.objects.get(memory_base=memory_base)
    job = session_ingest_enqueue(session=session, trigger=MemoryBaseJob.Trigger.AUTO)
    MemoryBaseJob.objects.filter(pk=job.pk).update(  # (it ran at once here: as if deferred)
        status="queued", finished_at=None, deferred_until=timezone.now() + timedelta(hours=9)
    )
    login(browser, live_server)
    for name, url in (
        ("admin-knowledge-bases", "/admin/knowledge/knowledgebase/"),
        ("admin-pending-updates", "/admin/memory_engine/pendingupdate/"),
        ("admin-chunks", "/admin/knowledge/chunk/"),
        ("admin-usage-days", "/admin/core/usageday/"),
        ("admin-usage-budgets", "/admin/core/usagebudget/"),
        ("admin-api-keys", "/admin/core/apikey/"),
        ("admin-access-events", "/admin/core/accessevent/"),
        ("admin-memory-base-jobs", "/admin/memory_bases/memorybasejob/"),
    ):
        browser.get(live_server.url + url)
        shot(browser, name)
        assert browser.execute_script("return window.innerWidth") == 1440
        assert fits_the_window(browser, "#result_list"), url
    browser.get(live_server.url + "/admin/core/apikey/add/")  # a new key's limits
    shot(browser, "admin-api-key-add")
    assert browser.find_element("name", "read_only") and browser.find_element(
        "name", "expires_at_0"
    )
