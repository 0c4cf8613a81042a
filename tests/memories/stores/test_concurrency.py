"""Two (and more) writers of one store at once: deduplication and max_items trimming
stay exact, because writes hold the store's row lock in one transaction."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

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


def _waiting_on_a_lock(seconds: float = 10.0) -> bool:
    """Another connection waits on a lock (the delete, behind the writer's)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cur.fetchone()[0]:
                return True
        time.sleep(0.02)
    return False


def _store_of_a_node(name: str):
    owner = UserFactory(username=f"owner-{name}")
    flow = flow_create(owner=owner, name="racing")
    doc = {
        "memory": [{"name": name, "type": "simple", "config": {}}],
        "nodes": [{"id": "n", "flow": "racing", "memories": [{"name": name}]}],
    }
    memory_config_apply(owner=owner, document=doc)
    return flow, MemoryStore.objects.get(name=name)


def _write_a_turn(flow):
    return lambda: node_memory_write(
        flow=flow, node_id="n", input="a question", output="An answer long enough to keep."
    )


def _in_thread(target) -> Future:
    """``target()`` on a connection of its own, closed after."""

    def run():
        try:
            return target()
        finally:
            connection.close()

    return ThreadPoolExecutor(max_workers=1).submit(run)


@pytest.mark.django_db(transaction=True)
def test_a_store_deleted_while_a_write_commits_goes_with_the_written_item(monkeypatch):
    """The write holds the store's lock with its item inserted when the delete comes: the
    delete waits for it, then deletes the store with that item (it answered 500: the
    delete removed the items it saw, then the store, and the item committed meanwhile
    broke the foreign key at its commit; the store stayed)."""
    from memories.stores.backends.simple import SimpleStore
    from memories.stores.services import memory_store_delete

    flow, store = _store_of_a_node("racing-write")
    inserted, release = threading.Event(), threading.Event()
    update = SimpleStore.update

    def held(self, write, prepared):
        result = update(self, write, prepared)
        inserted.set()
        release.wait(10)
        return result

    monkeypatch.setattr(SimpleStore, "update", held)
    writer = _in_thread(_write_a_turn(flow))
    assert inserted.wait(10)
    deleter = _in_thread(lambda: memory_store_delete(store=store))
    assert _waiting_on_a_lock()
    release.set()
    assert writer.result(20)[0].result.action == "added"
    assert deleter.result(20) is None  # (it was: IntegrityError, a 500)
    assert not MemoryStore.objects.filter(pk=store.pk).exists()
    assert not MemoryItem.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_write_meeting_a_store_being_deleted_is_a_404_and_writes_nothing(monkeypatch):
    """The delete holds the store when the write comes: the write waits, finds the store
    gone (404) and writes nothing; a delete of the store gone is a 404 too."""
    from core.errors import NotFound
    from memories.stores.backends.simple import SimpleStore
    from memories.stores.services import memory_store_delete

    flow, store = _store_of_a_node("racing-delete")
    deleting, release = threading.Event(), threading.Event()

    def held(self):
        deleting.set()
        release.wait(10)

    monkeypatch.setattr(SimpleStore, "deleted", held, raising=False)
    deleter = _in_thread(lambda: memory_store_delete(store=store))
    assert deleting.wait(10)
    writer = _in_thread(_write_a_turn(flow))
    assert _waiting_on_a_lock()
    release.set()
    assert deleter.result(20) is None
    assert isinstance(writer.exception(20), NotFound)
    assert not MemoryStore.objects.filter(pk=store.pk).exists()
    assert not MemoryItem.objects.exists()
    with pytest.raises(NotFound):
        memory_store_delete(store=store)
