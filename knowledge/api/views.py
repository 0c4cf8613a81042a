from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import PageNumberPagination
from core.api.schema import ERROR, paginated
from knowledge.api.serializers import (
    ChunkOutputSerializer,
    HitSerializer,
    IngestJobAnswerSerializer,
    IngestResultSerializer,
    IngestSerializer,
    KnowledgeBaseCreateSerializer,
    KnowledgeBaseOutputSerializer,
    KnowledgeBaseUpdateSerializer,
    MultiSearchSerializer,
    SearchAnswerSerializer,
    SearchSerializer,
    job_answer,
)
from knowledge.models import IngestJob, KnowledgeBase
from knowledge.rewrite import search_rewritten
from knowledge.search import SearchRequest, search_chunks
from knowledge.selectors import (
    chunk_list,
    ingest_job_get,
    knowledge_base_get,
    knowledge_base_list,
    knowledge_bases_for_search,
    with_live_chunks,
)
from knowledge.services import (
    DocumentIn,
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_update,
    knowledge_documents_submit,
)


def _get_kb(request: Request, kb_id: Any, *, counted: bool = False) -> KnowledgeBase:
    return knowledge_base_get(owner=request.user, kb_id=kb_id, counted=counted)


def _search_request(data: dict[str, Any]) -> SearchRequest:
    filters = dict(data.get("filters") or {})
    return SearchRequest(
        query=data.get("query") or None,
        vector=data.get("vector"),
        top_k=data["top_k"],
        mode=data["mode"],
        similarity_threshold=data.get("similarity_threshold"),
        since=filters.pop("since", None),
        until=filters.pop("until", None),
        filters=filters,
        rrf_k=data.get("rrf_k"),
        half_life_days=data.get("half_life_days"),
        query_cues=data.get("query_cues", True),
    )


def _run_search(bases: list[KnowledgeBase], data: dict[str, Any]) -> Response:
    request = _search_request(data)
    if data.get("rewrite") and request.query:
        found = search_rewritten(bases=bases, request=request)
        return Response(
            {
                "results": HitSerializer(found.hits, many=True).data,
                "rewrite": {"queries": found.queries, "model": found.model, "error": found.error},
            }
        )
    hits = search_chunks(bases=bases, request=request)
    return Response({"results": HitSerializer(hits, many=True).data})


class KnowledgeBaseListView(APIView):
    @extend_schema(
        summary="List knowledge bases", responses=paginated(KnowledgeBaseOutputSerializer)
    )
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(
            with_live_chunks(knowledge_base_list(owner=request.user)), request, view=self
        )
        return paginator.get_paginated_response(KnowledgeBaseOutputSerializer(page, many=True).data)

    @extend_schema(
        summary="Create a knowledge base",
        request=KnowledgeBaseCreateSerializer,
        responses={201: KnowledgeBaseOutputSerializer, 409: ERROR},
    )
    def post(self, request: Request) -> Response:
        data = KnowledgeBaseCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        kb = knowledge_base_create(owner=request.user, **data.validated_data)
        return Response(KnowledgeBaseOutputSerializer(kb).data, status=status.HTTP_201_CREATED)


class KnowledgeBaseDetailView(APIView):
    @extend_schema(summary="Get a knowledge base", responses=KnowledgeBaseOutputSerializer)
    def get(self, request: Request, kb_id: Any) -> Response:
        return Response(KnowledgeBaseOutputSerializer(_get_kb(request, kb_id, counted=True)).data)

    @extend_schema(
        summary="Rename or describe a knowledge base",
        request=KnowledgeBaseUpdateSerializer,
        responses={200: KnowledgeBaseOutputSerializer, 409: ERROR},
    )
    def patch(self, request: Request, kb_id: Any) -> Response:
        kb = _get_kb(request, kb_id, counted=True)
        data = KnowledgeBaseUpdateSerializer(data=request.data, context={"knowledge_base": kb})
        data.is_valid(raise_exception=True)
        kb = knowledge_base_update(knowledge_base=kb, **data.validated_data)
        return Response(KnowledgeBaseOutputSerializer(kb).data)

    @extend_schema(
        summary="Delete a knowledge base and its chunks",
        responses={204: None, 409: ERROR},
        description="409 in_use for the knowledge base of a memory base or a memory store: "
        "delete that instead.",
    )
    def delete(self, request: Request, kb_id: Any) -> Response:
        knowledge_base_delete(knowledge_base=_get_kb(request, kb_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class KnowledgeBaseDocumentsView(APIView):
    @extend_schema(
        summary="Add or replace documents",
        request=IngestSerializer,
        responses={201: IngestResultSerializer, 202: IngestJobAnswerSerializer, 409: ERROR},
        description="201 with the counts when ingested in the request; 202 with a job "
        "(Location: where to poll it) when queued.",
    )
    def post(self, request: Request, kb_id: Any) -> Response:
        kb = _get_kb(request, kb_id)
        data = IngestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        documents = [
            DocumentIn.from_payload(
                text=d["text"], source_key=d["source_key"], metadata=d["metadata"]
            )
            for d in data.validated_data["documents"]
        ]
        outcome = knowledge_documents_submit(
            knowledge_base=kb,
            documents=documents,
            background=data.validated_data["background"],
        )
        if isinstance(outcome, IngestJob):
            location = reverse("kb-job", kwargs={"kb_id": kb.pk, "job_id": outcome.pk})
            return Response(
                job_answer(outcome),
                status=status.HTTP_202_ACCEPTED,
                headers={"Location": location},
            )
        result = outcome
        return Response(
            {
                "documents": result.documents,
                "chunks_written": result.chunks_written,
                "chunks_deleted": result.chunks_deleted,
                "knowledge_base": str(kb.pk),
                "chunks": kb.chunk_count,
            },
            status=status.HTTP_201_CREATED,
        )


class KnowledgeBaseJobView(APIView):
    @extend_schema(summary="Get an ingestion job", responses=IngestJobAnswerSerializer)
    def get(self, request: Request, kb_id: Any, job_id: Any) -> Response:
        job = ingest_job_get(owner=request.user, kb_id=kb_id, job_id=job_id)
        return Response(job_answer(job))


class KnowledgeBaseChunksView(APIView):
    @extend_schema(
        summary="List a knowledge base's chunks", responses=paginated(ChunkOutputSerializer)
    )
    def get(self, request: Request, kb_id: Any) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(
            chunk_list(knowledge_base=_get_kb(request, kb_id)), request, view=self
        )
        return paginator.get_paginated_response(ChunkOutputSerializer(page, many=True).data)


class KnowledgeBaseSearchView(APIView):
    reads = True  # a read-only key may POST here (core.api.permissions)

    @extend_schema(
        summary="Search one knowledge base",
        request=SearchSerializer,
        responses={200: SearchAnswerSerializer},
    )
    def post(self, request: Request, kb_id: Any) -> Response:
        kb = _get_kb(request, kb_id)
        data = SearchSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return _run_search([kb], data.validated_data)


class SearchView(APIView):
    reads = True  # a read-only key may POST here (core.api.permissions)

    @extend_schema(
        summary="Search several knowledge bases",
        request=MultiSearchSerializer,
        responses={200: SearchAnswerSerializer},
    )
    def post(self, request: Request) -> Response:
        data = MultiSearchSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        bases = knowledge_bases_for_search(
            owner=request.user,
            kb_ids=data.validated_data.get("knowledge_base_ids"),
            include_memory_bases=data.validated_data["include_memory_bases"],
        )
        return _run_search(bases, data.validated_data)
