"""What the engine keeps of a scope goes when the scope is erased (``core.erasure``):
its pending updates, their run schedule and run records, its dreams, the running summaries of its
conversations (rows, in the erasure's transaction) and its journal, ``MEMORY.md`` and
dream diaries (files, once the erasure commits)."""

from __future__ import annotations

import logging
import shutil
from typing import Any

from django.db import transaction

from memories.conversations.summaries import scope_summaries_delete
from memories.engine import files
from memories.engine.models import Dream, FormationRun, PendingUpdate
from memories.engine.updates import schedule_name

logger = logging.getLogger(__name__)

FOLDERS = ("journal", "memory", "dreams")


def scope_erase_engine_data(
    *, owner_id: int, scope_id: int, scope: list[str], **_: Any
) -> dict[str, int]:
    """Receiver of ``scope_erased``: delete the scope's engine rows now and its files
    after the commit. Returns what it deleted (rows; files are counted in the log)."""
    from django_q.models import Schedule

    counts = {
        "pending_updates": PendingUpdate.objects.filter(scope_id=scope_id).delete()[0],
        "formation_runs": FormationRun.objects.filter(scope_id=scope_id).delete()[0],
        "dreams": Dream.objects.filter(scope_id=scope_id).delete()[0],
        "summaries": scope_summaries_delete(owner_id=owner_id, scope=scope),
    }
    Schedule.objects.filter(name=schedule_name(scope_id)).delete()
    transaction.on_commit(lambda: scope_files_delete(owner_id=owner_id, scope=scope))
    return counts


def scope_files_delete(*, owner_id: int, scope: list[str]) -> int:
    """Delete the scope's journal days, ``MEMORY.md`` and diaries: the files directly in
    its folders (a longer scope's folder nested inside is another scope's and stays),
    and the folders themselves once empty, where the storage has local paths."""
    store = files.storage()
    deleted = 0
    for folder in FOLDERS:
        name = f"{folder}/{files.scope_dir(owner_id, scope)}"
        count, subfolders = _delete_files_in(store, name)
        deleted += count
        if not subfolders:
            _remove_empty_folders(store, name)
    logger.info("erased %d engine files of a scope of owner %s", deleted, owner_id)
    return deleted


def all_files_delete(**_: Any) -> int:
    """Receiver of ``everything_flushed``: delete every owner's journals, ``MEMORY.md``
    files and diaries (the tables are empty and owner ids start again), folders
    included where the storage has local paths."""
    store = files.storage()
    deleted = 0
    pending = list(FOLDERS)
    while pending:
        name = pending.pop()
        count, subfolders = _delete_files_in(store, name)
        deleted += count
        pending.extend(f"{name}/{sub}" for sub in subfolders)
    for folder in FOLDERS:
        try:
            shutil.rmtree(store.path(folder), ignore_errors=True)  # (empty folders by now)
        except NotImplementedError:
            pass
    logger.info("flushed: deleted %d engine files", deleted)
    return deleted


def _delete_files_in(store: Any, name: str) -> tuple[int, list[str]]:
    """Delete the files directly in folder ``name``: how many, and its subfolders."""
    try:
        subfolders, names = store.listdir(name)
    except FileNotFoundError:
        return 0, []
    for file_name in names:
        store.delete(f"{name}/{file_name}")
    return len(names), subfolders


def _remove_empty_folders(store: Any, name: str) -> None:
    """The scope's folder and its empty parents (a folder name can hold an end user's
    id); only for storages with local paths."""
    import os

    try:
        path = store.path(name)
        root = store.path("")
    except NotImplementedError:
        return
    while os.path.abspath(path) != os.path.abspath(root):
        try:
            os.rmdir(path)
        except OSError:  # not empty (another scope's files), or gone
            return
        path = os.path.dirname(path)
