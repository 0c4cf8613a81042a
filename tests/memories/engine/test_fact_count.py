"""A scope's number of linked facts on its row (``fact_count``, migration 0009): equal
to its links after every kind of write, read by the search's size check, and never
written by Django."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection

from core.db_backend.base import table_owner
from memories.facts.models import Fact, FactLink, Scope
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_count, scope_fact_count
from memories.facts.services import FactIn, fact_add, fact_delete, fact_share, scope_erase
from tests.memories.engine.test_vector_half import Dims, add_facts
from tests.memories.facts.old_schema import old_schema

pytestmark = pytest.mark.django_db


def counts() -> dict[int, tuple[int, int]]:
    """Per scope: (its fact_count, its links counted)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT e.id, e.fact_count, (SELECT count(*) FROM memories_factlink u "
            "WHERE u.scope_id = e.id) FROM memories_scope e"
        )
        return {row[0]: (row[1], row[2]) for row in cur.fetchall()}


def assert_counts_true() -> None:
    wrong = {k: v for k, v in counts().items() if v[0] != v[1]}
    assert wrong == {}


def test_the_count_follows_every_link_written(alice, bob):
    e = Dims(384)
    facts = [FactIn(f"alice fact {i}", confidence=0.9) for i in range(6)]
    fact_add(owner=alice, scope=("org", "a"), facts=facts, embedder=e)
    fact_add(owner=alice, scope=("org", "b"), facts=facts[:2], embedder=e)
    fact_add(owner=bob, scope=("org", "a"), facts=facts[:3], embedder=e)
    a, b = (scope_find(owner=alice, scope=("org", x)) for x in "ab")
    assert (fact_count(scope=a), fact_count(scope=b)) == (6, 2)
    assert_counts_true()
    # Evicted past max_facts, shared with another scope, deleted, bulk-linked, erased.
    fact_add(owner=alice, scope=a, facts=[FactIn("one more", confidence=0.95)],
                  embedder=e, max_facts=5)  # fmt: skip
    assert fact_count(scope=a) == 5
    shared = Fact.objects.filter(scope=a).first()
    fact_share(scope=b, fact=shared)
    assert (fact_count(scope=a), fact_count(scope=b)) == (5, 3)
    fact_delete(owner=alice, fact_id=shared.pk, scope=("org", "a"))
    assert (fact_count(scope=a), fact_count(scope=b)) == (4, 3)
    c = Scope.objects.create(owner=alice, path=["org", "c"])
    FactLink.objects.bulk_create([FactLink(scope=c, fact=v) for v in Fact.objects.filter(scope=a)])
    assert fact_count(scope=c) == 4 == scope_fact_count(scope_id=c.pk)
    FactLink.objects.filter(scope=c).update(shared=True)  # (no scope changed)
    assert fact_count(scope=c) == 4
    assert_counts_true()
    scope_erase(scope=a)
    assert_counts_true()
    # Django never writes the column: a save of the scope leaves the count as it is.
    b.last_seen_at = b.created_at
    b.save()
    assert fact_count(scope=b) == 3
    assert_counts_true()


def test_a_deleted_fact_leaves_every_scope_counted(alice):
    """A fact shared by three scopes, deleted: its links go in one statement (three
    scopes' rows, locked in id order)."""
    e = Dims(384)
    fact_add(owner=alice, scope=("org", "a"), facts=[FactIn("alice likes tea")], embedder=e)
    fact = Fact.objects.get(content="alice likes tea")
    for name in ("b", "c"):
        fact_share(scope=Scope.objects.create(owner=alice, path=["org", name]), fact=fact)
    assert sorted(v[0] for v in counts().values()) == [1, 1, 1]
    fact.delete()
    assert sorted(v[0] for v in counts().values()) == [0, 0, 0]


@pytest.mark.django_db(transaction=True)
def test_the_migration_counts_the_links_already_there_and_a_truncate_zeroes(alice):
    add_facts(alice, ("org", "a"), 5)
    migration = importlib.import_module("memories.facts.migrations.0009_scope_fact_count")
    with old_schema(), connection.cursor() as cur:
        cur.execute(migration.DROP)
        cur.execute(migration.Migration.operations[0].sql)
    assert [v[0] for v in counts().values()] == [5]
    assert_counts_true()
    with table_owner(connection), connection.cursor() as cur:  # (TRUNCATE: the owner's)
        cur.execute("TRUNCATE memories_factlink")
    assert [v[0] for v in counts().values()] == [0]
