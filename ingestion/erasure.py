"""What the task queue keeps of an erased end user goes with them (``core.erasure``).

The chat proxy hands each user turn to ``form_memories`` by task
(``memories.proxy.chat``), so the turn's text travels in the task's arguments: in the
broker's queue (``OrmQ``) until a worker takes it, then in django-q2's task records
(``Task``: the last ``save_limit`` successes, and the failures). A queued one would
also bring the end user back after the erasure. This receiver deletes both, for the
end user's scope, in the erasure's transaction (a task a worker has already taken
runs; its record is all that stays of it)."""

from __future__ import annotations

from typing import Any

FORM_MEMORIES = "ingestion.tasks.form_memories"


def scope_erase_queued_turns(*, owner_id: int, scope: list[str], **_: Any) -> None:
    """Receiver of ``scope_erased``: for an end user's scope ``["user", <id>]``, delete
    the queued and recorded ``form_memories`` tasks of that user."""
    from django_q.models import OrmQ, Task

    if len(scope) != 2 or scope[0] != "user" or not scope[1]:
        return
    theirs = (owner_id, scope[1])
    recorded = Task.objects.filter(func=FORM_MEMORIES).only("id", "args")
    Task.objects.filter(pk__in=[t.pk for t in recorded if _of(t.args, theirs)]).delete()
    OrmQ.objects.filter(pk__in=queued_turns(owner_id=owner_id, external_id=scope[1])).delete()


def queued_turns(*, owner_id: int, external_id: str) -> list[int]:
    """The queue's ``form_memories`` tasks of this end user not taken by a worker yet
    (their ``OrmQ`` ids)."""
    from django_q.models import OrmQ

    theirs = (owner_id, external_id)
    return [q.pk for q in OrmQ.objects.all() if q.func() == FORM_MEMORIES
            and _of(q.args(), theirs)]  # fmt: skip


def _of(args: Any, theirs: tuple[int, str]) -> bool:
    """``form_memories(owner_id, external_id, message, ...)``'s arguments name them."""
    return isinstance(args, tuple | list) and tuple(args[:2]) == theirs
