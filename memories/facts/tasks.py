"""Thin django-q2 tasks of the facts room. Safe to run twice."""

from __future__ import annotations

from core.queue import enqueue, enqueue_on_commit
from core.tenancy import maintenance
from knowledge.services import knowledge_index_pending

TASK = "memories.facts.tasks.index_pending_facts"


def enqueue_fact_indexing(*, on_commit: bool = False) -> None:
    """Queue the indexer (once the surrounding write commits, with ``on_commit``). Never
    raises: the rows are searchable already, and the schedule picks them up."""
    (enqueue_on_commit if on_commit else enqueue)(TASK, task_name="index-pending-facts")


@maintenance("task index_pending_facts")
def index_pending_facts() -> int:
    """Queued after an import and every 5 minutes (schedule ``index-pending-facts``):
    add the facts an import left pending to their HNSW index. A run that hits its time
    budget queues its successor."""
    run = knowledge_index_pending(table="memories_fact")
    if not run.finished and not run.busy:
        enqueue_fact_indexing()
    return run.indexed
