"""One audit trail of access: each erasure the facts room recorded in its own table
(``memories.ScopeErasure``, memories 0018) becomes an ``erasure`` event here
(``core.audit``); memories 0021 then drops that table.

A copy carries what the record held: the owner, the actor as it was written (``api``,
``admin:<username>``, ``service``), the kind of scope and the counts (``detail``) and
the time of the erasure (``at``); no key or address (the record had none).

Since ``AccessEvent`` came (core 0006), each erasure was recorded both ways in one
transaction, a few milliseconds apart: such a record already has its event and is not
copied again, nor is one copied by an earlier run (same time). A record and an event
are the same erasure when they have the same owner, kind of scope and counts, an actor
that fits (``api`` was a request: its event names the key or user) and times at most
``SAME_ERASURE`` apart; the closest pairs are matched first, each event to one record
at most, so two alike erasures in a row are not folded into one.

Backwards this changes nothing: the events stay (memories 0021 undone makes the table
again, empty)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.db import migrations

SAME_ERASURE = timedelta(seconds=10)
SCOPE_KINDS = ("user", "scope", "global")  # what ScopeErasure recorded (not "session")


def _key(owner_id: int, scope_kind: Any, counts: Any) -> tuple[int, str, str]:
    return owner_id, str(scope_kind), json.dumps(counts, sort_keys=True)


def _fits(recorded: str, actor: str) -> bool:
    return recorded == actor or recorded == "api"


def copy_erasures(apps: Any, schema_editor: Any) -> None:
    ScopeErasure = apps.get_model("memories", "ScopeErasure")
    AccessEvent = apps.get_model("core", "AccessEvent")
    events = defaultdict(list)
    for event in AccessEvent.objects.filter(
        action="erasure", detail__scope_kind__in=SCOPE_KINDS
    ).only("id", "owner_id", "actor", "detail", "at"):
        key = _key(event.owner_id, event.detail.get("scope_kind"), event.detail.get("counts"))
        events[key].append(event)
    records = list(ScopeErasure.objects.order_by("erased_at", "id"))
    pairs = sorted(
        (abs(event.at - record.erased_at), record.pk, event.pk)
        for record in records
        for event in events[_key(record.owner_id, record.scope_kind, record.counts)]
        if abs(event.at - record.erased_at) <= SAME_ERASURE and _fits(record.actor, event.actor)
    )
    recorded: set[int] = set()
    taken: set[int] = set()
    for _, record_id, event_id in pairs:
        if record_id not in recorded and event_id not in taken:
            recorded.add(record_id)
            taken.add(event_id)
    for record in records:
        if record.pk in recorded:
            continue
        event = AccessEvent.objects.create(
            owner_id=record.owner_id, action="erasure", actor=record.actor[:200],
            detail={"scope_kind": record.scope_kind, "counts": record.counts},
        )  # fmt: skip
        # ``at`` is auto_now_add: the erasure's own time goes in after.
        AccessEvent.objects.filter(pk=event.pk).update(at=record.erased_at)


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0011_apikey_limits"),
        ("memories", "0018_scope_erasure"),
    ]

    operations = [migrations.RunPython(copy_erasures, migrations.RunPython.noop)]
