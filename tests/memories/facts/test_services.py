"""The one write service of facts: concurrency (the scope's lock and the duplicate re-check
under it), replacements of shared facts, idempotent adds, and each fact's injection
tokens counted when it is written. (What the per-message formation's tests asserted of
these, on the service every door now writes through.)"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from core.models import MetricCounter
from core.providers.tokens import count_tokens
from memories.facts.models import Fact, FactChange, FactLink
from memories.facts.scopes import end_user_ensure
from memories.facts.selectors import FactNotFound, facts_snapshot
from memories.facts.services import (
    FactIn,
    fact_add,
    fact_delete,
    fact_line,
    fact_restore,
    fact_share,
    fact_update,
    scope_lock,
)
from tests.memories.facts.seed import seed


def _active(scope) -> list[str]:
    return sorted(Fact.objects.filter(links__scope=scope).values_list("content", flat=True))


def _counter(name: str) -> int:
    return MetricCounter.objects.filter(name=name).values_list("value", flat=True).first() or 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_adds_of_the_same_fact_leave_one(alice, fixture_embedder):
    scope = end_user_ensure(owner=alice, external_id="u1")
    barrier = threading.Barrier(3)
    results: list[str] = []

    def run() -> None:
        try:
            barrier.wait()
            [decision] = fact_add(owner=alice.pk, scope=scope, reason="chat",
                                  facts=[FactIn("User drinks green tea every morning")])  # fmt: skip
            results.append(decision.action)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == ["add", "duplicate", "duplicate"]
    assert _active(scope) == ["User drinks green tea every morning"]
    assert Fact.objects.count() == 1
    assert FactChange.objects.filter(action="add").count() == 1
    assert (_counter("memory_additions_total"), _counter("memory_dedup_total")) == (1, 2)


@pytest.mark.django_db(transaction=True)
def test_concurrent_deletes_of_a_fact_delete_it_once_and_the_others_are_told(alice,
                                                                             fixture_embedder):  # fmt: skip
    """Ten parallel deletes of one fact answered five 204s (each had found it before the
    first committed): one deletes it, the others find it gone (404), one audit row."""
    scope = end_user_ensure(owner=alice, external_id="u1")
    [added] = fact_add(owner=alice, scope=scope,
                       facts=[FactIn("User drinks green tea every morning")])  # fmt: skip
    outcomes: list[str] = []

    def run() -> None:
        try:
            fact_delete(owner=alice.pk, fact_id=added.fact_id, scope=scope)
            outcomes.append("deleted")
        except FactNotFound:
            outcomes.append("not found")
        finally:
            connection.close()

    with transaction.atomic():
        scope_lock(scope=scope)  # (each finds the fact, then waits for the scope's lock)
        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        waiting = 0
        for _ in range(300):  # until all three wait on the lock
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")  # (else kept per transaction)
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = "
                               "'advisory' AND datname = current_database()")  # fmt: skip
                waiting = cursor.fetchone()[0]
            if waiting == 3:
                break
            time.sleep(0.05)
        assert waiting == 3
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["deleted", "not found", "not found"]
    assert FactChange.objects.filter(action="delete").count() == 1 and not _active(scope)


@pytest.mark.django_db
def test_a_replacement_of_a_shared_fact_is_this_scopes_only_and_audited(alice, fixture_embedder):
    u1, u2 = (end_user_ensure(owner=alice, external_id=u) for u in ("u1", "u2"))
    (bun,) = seed(u1, "User uses Bun")
    fact_share(scope=u2, fact=bun)
    [decision] = fact_add(owner=alice, scope=u1, reason="User switched from Bun to Node",
                          facts=[FactIn("User uses Node.js", replaces=bun.pk)])  # fmt: skip
    assert (decision.action, decision.target_id) == ("replace", str(bun.pk))
    assert _active(u1) == ["User uses Node.js"]
    assert _active(u2) == ["User uses Bun"]  # the other scope keeps the shared fact
    assert Fact.objects.filter(pk=bun.pk).exists()
    audit = FactChange.objects.get(scope=u1, action="replace")
    assert (audit.old_fact_id, audit.old_content, audit.new_content, audit.reason) == (
        bun.pk, "User uses Bun", "User uses Node.js", "User switched from Bun to Node",
    )  # fmt: skip
    assert str(audit.new_fact_id) == decision.fact_id
    assert _counter("memory_replacements_total") == 1


@pytest.mark.django_db
def test_adding_the_same_facts_again_writes_nothing(alice, fixture_embedder):
    scope = end_user_ensure(owner=alice, external_id="u1")
    facts = ["User drinks green tea every morning", "User plays the violin"]
    first = fact_add(owner=alice, scope=scope, facts=[FactIn(f) for f in facts])
    assert [d.action for d in first] == ["add", "add"]
    before = (Fact.objects.count(), FactChange.objects.count(), FactLink.objects.count())
    again = fact_add(owner=alice, scope=scope, facts=[FactIn(f) for f in facts])
    assert [(d.action, d.match) for d in again] == [("duplicate", "exact")] * 2
    assert [d.fact_id for d in again] == [d.fact_id for d in first]
    assert (Fact.objects.count(), FactChange.objects.count(), FactLink.objects.count()) == before


@pytest.mark.django_db
def test_each_write_counts_the_facts_injection_tokens(alice, fixture_embedder):
    scope = end_user_ensure(owner=alice, external_id="u1")
    (fact,) = seed(scope, "User plays the violin", category="knowledge", confidence=0.9)

    def counted(pk) -> tuple[int | None, int]:
        stored = Fact.objects.get(pk=pk)
        return stored.tokens, count_tokens(fact_line(stored))

    tokens, line = counted(fact.pk)
    assert tokens == line == count_tokens("- [knowledge | 0.90] User plays the violin")
    fact_update(owner=alice, fact_id=fact.pk, content="User prefers dark mode", confidence=0.5)
    tokens, line = counted(fact.pk)
    assert tokens == line == count_tokens("- [knowledge | 0.50] User prefers dark mode")
    fact_update(owner=alice, fact_id=fact.pk, category="preference")
    assert counted(fact.pk)[0] == count_tokens("- [preference | 0.50] User prefers dark mode")
    snapshot = facts_snapshot(scope=scope)
    Fact.objects.filter(pk=fact.pk).delete()
    restored = fact_restore(scope=scope, fact=snapshot[0], embedder=fixture_embedder,
                            embedding=fixture_embedder.embed(["User prefers dark mode"])[0],
                            reason="undo")  # fmt: skip
    tokens, line = counted(restored.pk)
    assert tokens == line == count_tokens("- [preference | 0.50] User prefers dark mode")
