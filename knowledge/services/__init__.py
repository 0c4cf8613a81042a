"""Writes for knowledge bases, one concern per module:

- ``bases``: create, rename, delete a knowledge base;
- ``ingest``: the ingestion helper (chunk, embed, write; delete and recount chunks);
- ``jobs``: background ingest jobs for large batches (lifecycle: ``core.jobs``);
- ``indexing``: the background HNSW indexer;
- ``errors``: the errors they raise and the typed ``DocumentIn``.
"""

from __future__ import annotations

from knowledge.services.bases import (
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_update,
)
from knowledge.services.errors import (
    COLUMN_KEYS,
    FILE_CHUNKING,
    MESSAGE_CHUNKING,
    DocumentIn,
    IndexRun,
    IngestCancelled,
    IngestResult,
    KnowledgeError,
    ReadOnlyKnowledgeBase,
)
from knowledge.services.indexing import (
    enqueue_chunk_indexing,
    knowledge_index_pending,
    knowledge_pending_count,
)
from knowledge.services.ingest import (
    knowledge_base_delete_chunks,
    knowledge_base_ingest,
    knowledge_base_recount,
)
from knowledge.services.jobs import (
    knowledge_base_has_active_jobs,
    knowledge_documents_submit,
    knowledge_ingest_job_create,
    knowledge_ingest_job_run,
    knowledge_ingest_jobs_run_for_base,
    knowledge_ingest_jobs_sweep,
)

__all__ = [
    "COLUMN_KEYS",
    "FILE_CHUNKING",
    "MESSAGE_CHUNKING",
    "DocumentIn",
    "IndexRun",
    "IngestCancelled",
    "IngestResult",
    "KnowledgeError",
    "ReadOnlyKnowledgeBase",
    "enqueue_chunk_indexing",
    "knowledge_base_create",
    "knowledge_base_delete",
    "knowledge_base_delete_chunks",
    "knowledge_base_has_active_jobs",
    "knowledge_base_ingest",
    "knowledge_base_recount",
    "knowledge_base_update",
    "knowledge_documents_submit",
    "knowledge_index_pending",
    "knowledge_ingest_job_create",
    "knowledge_ingest_job_run",
    "knowledge_ingest_jobs_run_for_base",
    "knowledge_ingest_jobs_sweep",
    "knowledge_pending_count",
]
