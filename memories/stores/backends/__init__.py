"""The built-in store types, registered on import (by the app's ``ready``)."""

from __future__ import annotations

from memories.stores.backends.blackboard import BlackboardConfig, BlackboardStore
from memories.stores.backends.file import FileConfig, FileStore
from memories.stores.backends.simple import SimpleConfig, SimpleStore
from memories.stores.registry import register_memory_store, store_type

if store_type("simple") is None:  # ready() runs once per process, but be safe on reloads
    register_memory_store(
        "simple",
        config_cls=SimpleConfig,
        factory=SimpleStore,
        summary="Turns summarised, deduplicated and searched by meaning and by keyword "
        "(pgvector and BM25 in PostgreSQL, fused); keyword-only without an embedder.",
    )
    register_memory_store(
        "file",
        config_cls=FileConfig,
        factory=FileStore,
        summary="Read-only: files and directories chunked (500/50) into a vector index, "
        "re-indexed when file hashes change on load.",
        read_only=True,
    )
    register_memory_store(
        "blackboard",
        config_cls=BlackboardConfig,
        factory=BlackboardStore,
        summary="Append-only log without embeddings, trimmed by count and age; retrieval "
        "returns the newest entries.",
    )
