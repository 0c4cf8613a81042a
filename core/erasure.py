"""Erasure of a memory scope, across the rooms that keep something of it.

The room that owns scopes (``memories.facts``: an end user is the scope
``["user", <id>]``) erases its facts and its scope row; rooms above it keep more of a
scope (the engine: pending updates, running summaries, the journal, ``MEMORY.md``,
dream diaries) but cannot be imported from below. So the owner of the scope sends
``scope_erased`` inside its erasure transaction, before the scope row goes, and each
room that keeps something of a scope connects a receiver (in its ``AppConfig.ready``)
that deletes its rows in that same transaction and its files once it commits
(``transaction.on_commit``): a failed erasure leaves everything, a committed one
leaves nothing.

Receivers get ``owner_id`` (int), ``scope_id`` (the scope row's id) and ``scope``
(the scope as a list of strings).
"""

from __future__ import annotations

from django.dispatch import Signal

scope_erased = Signal()


def send_scope_erased(*, sender: type, owner_id: int, scope_id: int, scope: list[str]) -> None:
    """Tell every room that keeps something of the scope to erase it (in the caller's
    transaction; a receiver's error aborts the erasure)."""
    scope_erased.send(sender=sender, owner_id=owner_id, scope_id=scope_id, scope=list(scope))


# Sent by ``manage.py flush`` once it emptied every table and reset the sequences: owner
# ids start again at 1, so what a room keeps outside the database under an owner's id
# (the engine's journals) would be the next owner of that id's. Each such room deletes
# it. (The test harness's flush keeps the sequences: nothing is sent.)
everything_flushed = Signal()
