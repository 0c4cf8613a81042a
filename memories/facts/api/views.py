from __future__ import annotations

from typing import Any

from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import PageNumberPagination
from core.api.schema import DeletedSerializer, paginated, wrapped
from core.providers.embeddings import get_embedder
from core.validation import validate_end_user_id
from memories.facts.api.serializers import (
    GlobalMemoryInSerializer,
    HistorySerializer,
    MemoryHitSerializer,
    MemoryOutputSerializer,
    MemorySearchSerializer,
    MemoryUpdateSerializer,
)
from memories.facts.facts import FactIn, core_fact_add
from memories.facts.models import EndUser, Vector
from memories.facts.selectors import (
    end_user_find,
    global_memory_list,
    memories_by_id,
    memory_get,
    memory_history,
    memory_list,
    memory_search,
)
from memories.facts.services import (
    end_user_ensure,
    end_user_erase,
    global_memory_create,
    global_memory_delete,
    memory_delete,
    memory_update,
)


def _user_id(user_id: str) -> str:
    return validate_end_user_id(user_id)


def _existing_user(request: Request, user_id: str) -> EndUser:
    end_user = end_user_find(owner=request.user, external_id=_user_id(user_id))
    if end_user is None:
        raise Http404
    return end_user


def _memory(request: Request, user_id: str, memory_id: Any) -> tuple[EndUser, Vector]:
    end_user = _existing_user(request, user_id)
    return end_user, memory_get(end_user=end_user, vector_id=memory_id)


class UserMemoriesView(APIView):
    """An end user's memories: list, add (``add_as_given``), forget. The route's view is
    ``ingestion.api.user_memories.UserMemoriesView``, which adds ``POST``: its
    ``infer: true`` runs the debounced-update pipeline (``ingestion.updates``), which
    this room may not import."""

    @extend_schema(
        summary="List an end user's memories", responses=paginated(MemoryOutputSerializer)
    )
    def get(self, request: Request, user_id: str) -> Response:
        end_user = end_user_find(owner=request.user, external_id=_user_id(user_id))
        qs = memory_list(end_user=end_user) if end_user else Vector.objects.none()
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response(MemoryOutputSerializer(page, many=True).data)

    def add_as_given(self, request: Request, external_id: str, values: dict[str, Any]) -> Response:
        """``infer: false``: the texts stored as given through the engine's write path
        (``core_fact_add``): confidence 1.0, source ``api``, exact duplicates skipped,
        and the scope trimmed to ``ENGINE_MAX_FACTS`` (each eviction audited)."""
        end_user = end_user_ensure(owner=request.user, external_id=external_id)
        now = timezone.now()
        decisions = core_fact_add(
            owner=request.user.pk, scope=end_user, reason="added through the API",
            dedup_threshold=1.01,  # as given: only the same text is a duplicate
            facts=[FactIn(text, observed_at=now, metadata=values.get("metadata") or {})
                   for text in values["texts"]],
        )  # fmt: skip
        kept = [d for d in decisions if d.action in ("add", "duplicate")]
        found = memories_by_id(end_user=end_user, ids=[d.fact_id for d in kept if d.fact_id])
        stored = [found[d.fact_id] for d in kept if d.action == "add" and d.fact_id in found]
        duplicates = [
            found[d.fact_id] for d in kept if d.action == "duplicate" and d.fact_id in found
        ]
        return Response(
            {
                "memories": MemoryOutputSerializer(stored, many=True).data,
                "duplicates": MemoryOutputSerializer(duplicates, many=True).data,
                "evicted": decisions[-1].evicted_ids if decisions else [],
            },
            status=status.HTTP_201_CREATED if stored else status.HTTP_200_OK,
        )

    @extend_schema(
        summary="Forget an end user",
        operation_id="api_v1_users_forget",
        responses={200: DeletedSerializer},
    )
    def delete(self, request: Request, user_id: str) -> Response:
        removed = end_user_erase(end_user=_existing_user(request, user_id))
        return Response({"deleted": removed})


class UserMemorySearchView(APIView):
    @extend_schema(
        summary="Search an end user's memories",
        parameters=[MemorySearchSerializer],
        responses=wrapped("results", MemoryHitSerializer),
    )
    def get(self, request: Request, user_id: str) -> Response:
        external_id = _user_id(user_id)
        query = MemorySearchSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        end_user = end_user_find(owner=request.user, external_id=external_id)
        if end_user is None and not params["include_globals"]:
            return Response({"results": []})
        embedder = get_embedder()
        hits = memory_search(
            owner_id=request.user.pk,
            end_user=end_user,
            vector=embedder.embed([params["q"]])[0],
            embedding_model=embedder.model,
            top_k=params["top_k"],
            threshold=params.get("threshold"),
            include_globals=params["include_globals"],
            half_life_days=params.get("half_life_days"),
        )
        return Response({"results": MemoryHitSerializer(hits, many=True).data})


class UserMemoryDetailView(APIView):
    @extend_schema(summary="Get a memory", responses=MemoryOutputSerializer)
    def get(self, request: Request, user_id: str, memory_id: Any) -> Response:
        return Response(MemoryOutputSerializer(_memory(request, user_id, memory_id)[1]).data)

    @extend_schema(
        summary="Change a memory's content",
        request=MemoryUpdateSerializer,
        responses=MemoryOutputSerializer,
    )
    def patch(self, request: Request, user_id: str, memory_id: Any) -> Response:
        end_user, vector = _memory(request, user_id, memory_id)
        data = MemoryUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        new = memory_update(
            end_user=end_user, vector=vector, content=data.validated_data["content"]
        )
        return Response(MemoryOutputSerializer(new).data)

    @extend_schema(summary="Delete a memory", responses={204: None})
    def delete(self, request: Request, user_id: str, memory_id: Any) -> Response:
        end_user, vector = _memory(request, user_id, memory_id)
        memory_delete(end_user=end_user, vector=vector)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UserMemoryHistoryView(APIView):
    @extend_schema(summary="A memory's history", responses=wrapped("results", HistorySerializer))
    def get(self, request: Request, user_id: str, memory_id: Any) -> Response:
        end_user = _existing_user(request, user_id)
        rows = list(memory_history(end_user=end_user, vector_id=memory_id))
        if not rows:
            raise Http404
        return Response({"results": HistorySerializer(rows, many=True).data})


class GlobalMemoriesView(APIView):
    @extend_schema(summary="List global memories", responses=paginated(MemoryOutputSerializer))
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(
            global_memory_list(owner=request.user), request, view=self
        )
        return paginator.get_paginated_response(MemoryOutputSerializer(page, many=True).data)

    @extend_schema(
        summary="Add a global memory",
        request=GlobalMemoryInSerializer,
        responses={201: MemoryOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        data = GlobalMemoryInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        vector = global_memory_create(owner=request.user, content=data.validated_data["content"])
        return Response(MemoryOutputSerializer(vector).data, status=status.HTTP_201_CREATED)


class GlobalMemoryDetailView(APIView):
    @extend_schema(summary="Delete a global memory", responses={204: None})
    def delete(self, request: Request, memory_id: Any) -> Response:
        vector = global_memory_list(owner=request.user).filter(pk=memory_id).first()
        if vector is None:
            raise Http404
        global_memory_delete(vector=vector)
        return Response(status=status.HTTP_204_NO_CONTENT)
