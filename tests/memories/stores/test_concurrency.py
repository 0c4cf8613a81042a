"""Two (and more) writers of one store at once: deduplication and max_items trimming
stay exact, because writes hold the store's row lock in one transaction."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from memories.conversations.services import flow_create
from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryItem, MemoryStore
from memories.stores.runtime import node_memory_write
from tests.factories import UserFactory


@pytest.mark.django_db(transaction=True)
def test_parallel_writers_keep_dedup_and_trimming_exact():
    owner = UserFactory(username="writer")
    flow = flow_create(owner=owner, name="busy")
    doc = {
        "memory": [
            {"name": "dedup", "type": "simple", "config": {}},
            {"name": "shared", "type": "simple", "config": {"max_items": 5}},
            {"name": "log", "type": "blackboard", "config": {"max_items": 4}},
        ],
        "nodes": [
            {
                "id": "a",
                "flow": "busy",
                "memories": [{"name": "dedup"}, {"name": "shared"}, {"name": "log"}],
            },
            # the same stores in another order: the lock order must not deadlock
            {
                "id": "b",
                "flow": "busy",
                "memories": [{"name": "log"}, {"name": "shared"}, {"name": "dedup"}],
            },
        ],
    }
    memory_config_apply(owner=owner, document=doc)
    workers, per_worker = 6, 4
    barrier = threading.Barrier(workers)
    outcomes: list[tuple[str, str, str, int | None]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(worker: int) -> None:
        try:
            barrier.wait()
            for n in range(per_worker):
                for question, answer in (
                    (
                        f"question {worker}-{n}",
                        f"The distinct answer of worker {worker}, turn {n}.",
                    ),
                    ("the shared question", "Everyone writes this very same answer at once."),
                ):
                    results = node_memory_write(
                        flow=flow, node_id="ab"[worker % 2], input=question, output=answer
                    )
                    with lock:
                        outcomes.extend(
                            (r.store, question, r.result.action, r.result.item_id) for r in results
                        )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    # Deduplication: every distinct turn added once, the shared one once, the rest duplicates.
    dedup = [(q, a) for s, q, a, _ in outcomes if s == "dedup"]
    shared_turn = [a for q, a in dedup if q == "the shared question"]
    assert shared_turn.count("added") == 1
    assert shared_turn.count("duplicate") == workers * per_worker - 1
    assert [a for q, a in dedup if q != "the shared question"] == ["added"] * workers * per_worker
    assert MemoryItem.objects.filter(store__name="dedup").count() == workers * per_worker + 1
    # Trimming: exactly max_items left, the newest ones, no summary twice.
    shared = MemoryStore.objects.get(name="shared")
    added = sorted(
        int(i) for i in MemoryItem.objects.filter(store=shared).values_list("id", flat=True)
    )
    ever_added = sorted(i for s, _, a, i in outcomes if s == "shared" and a == "added" and i)
    assert added == ever_added[-5:]
    assert len(set(MemoryItem.objects.filter(store=shared).values_list("summary_hash"))) == 5
    assert MemoryItem.objects.filter(store__name="log").count() == 4
    assert all(a in ("added", "duplicate") for _, _, a, _ in outcomes)
