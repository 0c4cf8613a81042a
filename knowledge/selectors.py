"""Reads for knowledge bases, always scoped by owner."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, Exists, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from core.errors import NotFound
from core.key_limits import not_owned, resource_check, resource_filter
from core.providers.embeddings import Embedder, EmbeddingConfig, embedder_for
from knowledge.models import Chunk, IngestJob, KnowledgeBase


def knowledge_base_list(
    *, owner: User, include_memory_bases: bool = True
) -> QuerySet[KnowledgeBase]:
    qs = resource_filter(KnowledgeBase.objects.filter(owner=owner), "knowledge_bases")
    if not include_memory_bases:
        qs = qs.filter(is_memory_base=False)
    return qs.order_by("name", "id")


def knowledge_bases_not_owned(owner_id: int, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Of ``ids``, those that are not the owner's bases (a key's limits: core.key_limits)."""
    return not_owned(KnowledgeBase.objects.filter(owner_id=owner_id), ids)


def with_live_chunks(qs: QuerySet[KnowledgeBase]) -> QuerySet[KnowledgeBase]:
    """Each base with ``live_chunks``: its chunk rows counted, the count every page that
    shows a base shows (a memory base's page counts them too; the stored counter lags a
    deletion made behind the service's back until the base is recounted). Only for
    those pages: it reads every chunk row's index entry."""
    return qs.annotate(live_chunks=chunk_count_subquery(OuterRef("pk")))


def knowledge_base_get(
    *, owner: User, kb_id: uuid.UUID | str, counted: bool = False
) -> KnowledgeBase:
    """Raises KnowledgeBase.DoesNotExist for a missing base or another owner's.
    ``counted``: with ``live_chunks`` (for the answers that show the base; a search or
    an ingestion does not count a large base's rows)."""
    qs = KnowledgeBase.objects.filter(owner=owner)
    kb = (with_live_chunks(qs) if counted else qs).get(pk=kb_id)
    resource_check("knowledge_bases", kb.pk)
    return kb


def ingest_job_get_by_id(*, owner: User, job_id: uuid.UUID | str) -> IngestJob:
    """Raises IngestJob.DoesNotExist unless the job's base belongs to ``owner``."""
    job = IngestJob.objects.defer("documents").get(pk=job_id, knowledge_base__owner=owner)
    resource_check("knowledge_bases", job.knowledge_base_id)
    return job


def ingest_job_get(*, owner: User, kb_id: Any, job_id: uuid.UUID | str) -> IngestJob:
    """Raises IngestJob.DoesNotExist unless the job's base belongs to ``owner``."""
    job = IngestJob.objects.defer("documents").get(  # the stored batch: up to MAX_REQUEST_BYTES
        pk=job_id, knowledge_base_id=kb_id, knowledge_base__owner=owner
    )
    resource_check("knowledge_bases", job.knowledge_base_id)
    return job


def knowledge_bases_for_search(
    *,
    owner: User,
    kb_ids: Sequence[uuid.UUID | str] | None,
    include_memory_bases: bool,
) -> list[KnowledgeBase]:
    """The bases a search covers.

    Named ids are searched whatever their kind (a memory base named by id is
    searched); raises NotFound (naming them) if any id is not the owner's; an empty list names
    none. Without ids (None): all of the owner's bases, leaving out memory bases
    unless asked to include them.
    """
    if kb_ids is not None:
        wanted = {str(k) for k in kb_ids}
        bases = list(KnowledgeBase.objects.filter(owner=owner, pk__in=wanted))
        if len(bases) != len(wanted):
            missing = sorted(wanted - {str(kb.pk) for kb in bases})
            raise NotFound(f"knowledge_base_ids: no knowledge base {', '.join(missing)}",
                           details={"knowledge_base_ids": missing})  # fmt: skip
        for kb in bases:
            resource_check("knowledge_bases", kb.pk)
        return bases
    return list(knowledge_base_list(owner=owner, include_memory_bases=include_memory_bases))


def chunk_list(*, knowledge_base: KnowledgeBase) -> QuerySet[Chunk]:
    return (
        Chunk.objects.filter(knowledge_base=knowledge_base)
        .defer("embedding")
        .order_by("document_key", "chunk_index", "id")
    )


def chunk_count_subquery(knowledge_base_ref: Any) -> Coalesce:
    """The number of chunk rows of the base named by ``knowledge_base_ref`` (an id or
    an ``OuterRef``), counted from the table (not the base's stored counters, which a
    deletion behind the service's back leaves behind), for other rooms' annotations."""
    per_base = (
        Chunk.objects.filter(knowledge_base_id=knowledge_base_ref)
        .order_by()
        .values("knowledge_base_id")
        .annotate(c=Count("*"))
        .values("c")
    )
    return Coalesce(Subquery(per_base, output_field=IntegerField()), 0)


def session_has_chunks(knowledge_base_ref: Any, session_ref: Any) -> Exists:
    """Whether the base holds a chunk of the session (both refs an id or an
    ``OuterRef``), for other rooms' annotations."""
    return Exists(
        Chunk.objects.filter(knowledge_base_id=knowledge_base_ref, session_id=session_ref)
    )


def kb_embedding_config(kb: KnowledgeBase) -> EmbeddingConfig:
    """The embedding provider, model and dimension the base was created with."""
    return EmbeddingConfig(
        provider=kb.embedding_provider,
        model=kb.embedding_model,
        dimensions=kb.embedding_dimensions,
    )


def kb_embedder(kb: KnowledgeBase) -> Embedder:
    return embedder_for(kb_embedding_config(kb))


def chunk_nearest_sql(
    *, knowledge_base_id: Any, dims: int, vector: str, limit: int, index: bool
) -> tuple[str, list[Any]]:
    """One statement giving the ``limit`` chunks of a base nearest ``vector`` (a vector
    literal) by cosine, nearest first, as (id, text, file_path, chunk_index, distance,
    index_pending), for a caller that sends it beside statements of its own (the memory
    stores put it in their retrieve call's one query string).

    ``index``: through the HNSW index of ``dims`` (ranking by the index's type, handing
    back the exact distance), with the rows the background indexer has not reached yet
    ranked exactly beside it, as ``knowledge.search`` does: up to ``limit`` rows of each,
    for the caller to cut; the caller sets ``hnsw.ef_search`` (and the iterative scan) for
    its transaction and redoes exactly an answer whose index rows came back short.
    Otherwise an exact scan of the base.
    """
    from knowledge.retrieval.hnsw import index_type

    table = Chunk._meta.db_table
    columns = (
        "id, text, file_path, chunk_index, embedding <=> (SELECT q FROM qv) AS d, index_pending"
    )
    head = "WITH qv AS (SELECT %s::vector AS q) "
    if not index:
        sql = (
            f"{head}SELECT {columns} FROM {table} WHERE knowledge_base_id = %s "
            "ORDER BY d, id LIMIT %s"
        )
        return sql, [vector, knowledge_base_id, limit]
    kind = index_type("chunk_hnsw", dims)
    sql = (
        f"{head}SELECT * FROM ((SELECT {columns} FROM {table} WHERE dimensions = {dims} AND "
        f"NOT index_pending AND knowledge_base_id = %s ORDER BY embedding::{kind}({dims}) <=> "
        f"(SELECT q::{kind}({dims}) FROM qv) LIMIT %s) UNION ALL (SELECT {columns} FROM {table} "
        "WHERE index_pending AND knowledge_base_id = %s ORDER BY d LIMIT %s)) c ORDER BY d, id"
    )
    return sql, [vector, knowledge_base_id, limit, knowledge_base_id, limit]
