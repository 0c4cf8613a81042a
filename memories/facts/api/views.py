"""The personal memories API (``/api/v1/users/{user_id}/memories``) and global memories
(``/api/v1/global-memories``): thin views over the one write service, the one search and
the selectors of facts; an end user is the scope ``["user", <id>]``, global memories the
owner's global scope."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import PageNumberPagination
from core.api.schema import ERROR, paginated
from core.errors import InvalidInput
from core.key_limits import end_user_check
from core.validation import validate_end_user_id
from memories.facts.api.serializers import (
    AS_OF_HELP,
    VALID_AT_HELP,
    ErasedSerializer,
    FactHistoryOutputSerializer,
    FactUpdateSerializer,
    GlobalMemoryInSerializer,
    HistorySerializer,
    MemoryHitSerializer,
    MemoryOutputSerializer,
    MemorySearchOutputSerializer,
    MemorySearchQuerySerializer,
    MemorySearchSerializer,
    VersionSerializer,
)
from memories.facts.models import Scope
from memories.facts.scopes import (
    end_user_ensure,
    global_scope_ensure,
    global_scope_find,
    user_scope,
)
from memories.facts.search import fact_filter, fact_search
from memories.facts.selectors import (
    FactNotFound,
    ScopeNotFound,
    end_user_find,
    fact_get,
    fact_history,
    fact_list,
    fact_versions,
    facts_by_id,
    global_fact_list,
    timeline_list,
)
from memories.facts.services import FactIn, fact_add, fact_delete, fact_update, scope_erase
from memories.facts.timeline import at_from

API_SOURCE = {"kind": "api"}


def _user_id(user_id: str) -> str:
    """The route's end-user id, valid and in reach of the request's key (the one way
    every ``users/{id}`` route reads it: core.key_limits)."""
    external_id = validate_end_user_id(user_id)
    end_user_check(external_id)
    return external_id


def existing_user(request: Request, user_id: str) -> Scope:
    """The caller's end user ``user_id``; ``ScopeNotFound`` (404) if it has none."""
    end_user = end_user_find(owner=request.user, external_id=_user_id(user_id))
    if end_user is None:
        raise ScopeNotFound("no such end user")
    return end_user


def _validated(serializer_class: type, data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class UserMemoriesView(APIView):
    """An end user's memories: list, add (``add_as_given``), forget. The route's view is
    ``ingestion.api.user_memories.UserMemoriesView``, which adds ``POST``: its
    ``infer: true`` runs the debounced-update pipeline (``ingestion.updates``), which
    this room may not import."""

    @extend_schema(
        summary="List an end user's memories",
        responses={200: paginated(MemoryOutputSerializer), 404: ERROR},
        parameters=[
            OpenApiParameter("as_of", str, description=AS_OF_HELP),
            OpenApiParameter("valid_at", str, description=VALID_AT_HELP),
        ],
        description="Highest confidence first, then the most recently changed. An end "
        "user the caller does not have is a 404 scope_not_found. With as_of / valid_at: "
        "the versions of that time.",
    )
    def get(self, request: Request, user_id: str) -> Response:
        at = at_from(request.query_params.get("as_of"), request.query_params.get("valid_at"))
        end_user = existing_user(request, user_id)
        facts: Any = (
            fact_list(scope=end_user) if at is None else timeline_list(scope=end_user, at=at)
        )
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(facts, request, view=self)
        return paginator.get_paginated_response(MemoryOutputSerializer(page, many=True).data)

    def add_as_given(self, request: Request, external_id: str, values: dict[str, Any]) -> Response:
        """``infer: false``: the texts stored as given through the write service
        (``fact_add``): source ``api``, exact duplicates skipped, and the scope trimmed to
        ``ENGINE_MAX_FACTS`` (each eviction audited)."""
        # Texts below the threshold write nothing, and make no end user either.
        end_user = (end_user_ensure(owner=request.user, external_id=external_id)
                    if values["confidence"] >= settings.ENGINE_MIN_CONFIDENCE else None)  # fmt: skip
        now = timezone.now()
        validity = values.get("validity") or {}
        facts = [FactIn(text, category=values["category"], confidence=values["confidence"],
                        observed_at=now, metadata=values.get("metadata") or {},
                        valid_from=validity.get("valid_from"), valid_to=validity.get("valid_to"))
                 for text in values["texts"]]  # fmt: skip
        decisions = fact_add(
            owner=request.user.pk, scope=end_user or user_scope(external_id),
            reason="added through the API", facts=facts,
            dedup_threshold=1.01,  # as given: only the same text is a duplicate
            source=API_SOURCE,
        )  # fmt: skip
        kept = [d for d in decisions if d.action in ("add", "duplicate")]
        found = facts_by_id(scope=end_user, ids=[d.fact_id for d in kept if d.fact_id]) if (
            end_user is not None) else {}  # fmt: skip
        stored = [found[d.fact_id] for d in kept if d.action == "add" and d.fact_id in found]
        duplicates = [
            found[d.fact_id] for d in kept if d.action == "duplicate" and d.fact_id in found
        ]
        return Response(
            {
                "memories": MemoryOutputSerializer(stored, many=True).data,
                "duplicates": MemoryOutputSerializer(duplicates, many=True).data,
                "evicted": decisions[-1].evicted_ids if decisions else [],
                "below_threshold": [
                    {"content": d.content, "reason": d.reason}
                    for d in decisions
                    if d.action == "below_threshold"
                ],  # fmt: skip
            },
            status=status.HTTP_201_CREATED if stored else status.HTTP_200_OK,
        )

    @extend_schema(
        summary="Forget an end user",
        operation_id="api_v1_users_forget",
        responses={200: ErasedSerializer, 404: ERROR},
    )
    def delete(self, request: Request, user_id: str) -> Response:
        end_user = existing_user(request, user_id)
        path = list(end_user.path)
        removed = scope_erase(scope=end_user)
        return Response({"scope": path, "facts_removed": removed, "deleted": removed})


class UserMemorySearchView(APIView):
    """``POST`` (as every search) or ``GET`` (the older alias, query parameters) with the
    search every door makes: the same query on the same scope returns the same facts in
    the same order as ``/api/v1/engine/search``, the tools and MCP."""

    reads = True  # a read-only key may POST here (core.api.permissions)

    def _search(self, request: Request, user_id: str, data: Any) -> Response:
        params = _validated(MemorySearchSerializer, data)
        end_user = existing_user(request, user_id)
        found = fact_search(
            owner=request.user, scope=end_user, query=params["query"], limit=params["limit"],
            offset=params["offset"], filter=fact_filter(params.get("filter")),
            half_life_days=params.get("half_life_days"),
            include_globals=params["include_globals"], at=params["at"],
        )  # fmt: skip
        hits = found.hits
        if params.get("threshold") is not None:
            hits = [
                h for h in hits if h.similarity is not None and h.similarity >= params["threshold"]
            ]
        return Response(
            {
                "scope": list(end_user.path),
                "mode": found.mode,
                "results": MemoryHitSerializer(hits, many=True).data,
            }
        )

    @extend_schema(
        summary="Search an end user's memories",
        request=MemorySearchSerializer,
        responses={200: MemorySearchOutputSerializer, 404: ERROR},
    )
    def post(self, request: Request, user_id: str) -> Response:
        return self._search(request, user_id, request.data)

    @extend_schema(
        summary="Search an end user's memories (query parameters)",
        parameters=[MemorySearchQuerySerializer],
        responses={200: MemorySearchOutputSerializer, 404: ERROR},
        description="The older alias of POST: the same search with its parameters in the "
        "query string (no filter).",
    )
    def get(self, request: Request, user_id: str) -> Response:
        if "filter" in request.query_params:  # (it was ignored: every memory matched)
            raise InvalidInput.at("filter", "the GET form takes no filter: POST the search")
        return self._search(request, user_id, request.query_params)


class UserMemoryDetailView(APIView):
    @extend_schema(summary="Get a memory", responses={200: MemoryOutputSerializer, 404: ERROR})
    def get(self, request: Request, user_id: str, memory_id: uuid.UUID) -> Response:
        end_user = existing_user(request, user_id)
        return Response(MemoryOutputSerializer(fact_get(scope=end_user, fact_id=memory_id)).data)

    @extend_schema(
        summary="Change a memory",
        request=FactUpdateSerializer,
        responses={200: MemoryOutputSerializer, 404: ERROR, 409: ERROR},
        description="Any of content (or text), category, confidence, and the reason the "
        "audit records. A memory shared with other users gives this user a new one "
        "(copy on write).",
    )
    def patch(self, request: Request, user_id: str, memory_id: uuid.UUID) -> Response:
        end_user = existing_user(request, user_id)
        data = _validated(FactUpdateSerializer, request.data)
        fact = fact_update(
            owner=request.user, fact_id=memory_id, scope=end_user, content=data.get("content"),
            category=data.get("category"), confidence=data.get("confidence"),
            reason=data["reason"], source=API_SOURCE, validity=data["validity"],
            refuse_duplicate=True,
        )  # fmt: skip
        return Response(MemoryOutputSerializer(fact).data)

    @extend_schema(summary="Delete a memory", responses={204: None, 404: ERROR})
    def delete(self, request: Request, user_id: str, memory_id: uuid.UUID) -> Response:
        end_user = existing_user(request, user_id)
        fact_delete(owner=request.user, fact_id=memory_id, scope=end_user, source=API_SOURCE)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UserMemoryHistoryView(APIView):
    @extend_schema(
        summary="A memory's history",
        responses={200: FactHistoryOutputSerializer, 404: ERROR},
        description="Its versions, oldest first (the current one last), and the audit "
        "rows of its changes (results): as GET /api/v1/engine/facts/{id}/history.",
    )
    def get(self, request: Request, user_id: str, memory_id: uuid.UUID) -> Response:
        return history_response(request.user, memory_id, existing_user(request, user_id))


def history_response(owner: Any, fact_id: uuid.UUID, row: Any) -> Response:
    """``{"versions", "results"}`` of a fact in a scope; 404 when it has neither."""
    versions = fact_versions(scope=row, fact_id=fact_id) if row is not None else []
    changes = (
        list(fact_history(scope=row, fact_id=fact_id, versions=versions))
        if row is not None else []
    )  # fmt: skip
    if not versions and not changes:
        raise FactNotFound("no such fact")
    return Response({
        "versions": VersionSerializer(versions, many=True).data,
        "results": HistorySerializer(changes, many=True).data,
    })  # fmt: skip


class GlobalMemoriesView(APIView):
    @extend_schema(summary="List global memories", responses=paginated(MemoryOutputSerializer))
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(global_fact_list(owner=request.user), request, view=self)
        data = MemoryOutputSerializer(page, many=True, context={"global": True}).data
        return paginator.get_paginated_response(data)

    @extend_schema(
        summary="Add a global memory",
        request=GlobalMemoryInSerializer,
        responses={201: MemoryOutputSerializer, 200: MemoryOutputSerializer},
        description="A fact of the owner's global memories, shown to end users with few "
        "memories of their own. 201 when added, 200 with the stored one when the global "
        "memories already hold the same text or meaning.",
    )
    def post(self, request: Request) -> Response:
        data = _validated(GlobalMemoryInSerializer, request.data)
        scope = global_scope_ensure(owner=request.user)
        [decision] = fact_add(
            owner=request.user, scope=scope, reason="global memory added through the API",
            facts=[FactIn(data["content"], category=data["category"])],
        )  # fmt: skip
        fact = fact_get(scope=scope, fact_id=str(decision.fact_id))
        created = decision.action == "add"
        return Response(
            MemoryOutputSerializer(fact, context={"global": True}).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class GlobalMemoryDetailView(APIView):
    @extend_schema(summary="Delete a global memory", responses={204: None, 404: ERROR})
    def delete(self, request: Request, memory_id: uuid.UUID) -> Response:
        scope = global_scope_find(owner=request.user)
        if scope is None:
            raise FactNotFound("no such fact")
        fact_delete(owner=request.user, fact_id=memory_id, scope=scope)
        return Response(status=status.HTTP_204_NO_CONTENT)
