"""The engine over REST: ``/api/v1/engine/...``. Thin views over ``MemoryEngine``."""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

from django.contrib.auth.models import AbstractBaseUser
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.fields import StrictCharField, StrictIntegerField
from core.api.pagination import paginated_response
from core.api.schema import ERROR, paginated
from core.errors import InvalidInput
from memories.engine.api.serializers import (
    DecisionSerializer,
    FactCreateSerializer,
    FactOutputSerializer,
    FactUpdateSerializer,
    HitSerializer,
    InjectionSerializer,
    ScopedSerializer,
    SearchOutputSerializer,
    SearchSerializer,
    user_header_value,
)
from memories.engine.facade import MemoryEngine
from memories.facts.api.serializers import AS_OF_HELP, VALID_AT_HELP, FactHistoryOutputSerializer
from memories.facts.api.views import history_response
from memories.facts.injection import injection_payload
from memories.facts.models import CATEGORIES
from memories.facts.scopes import ScopePath
from memories.facts.search import FactFilter
from memories.facts.selectors import (
    FactNotFound,
    fact_find,
    fact_list,
    fact_resolve,
    timeline_list,
    version_scope,
)
from memories.facts.timeline import at_from

SCOPE_PARAMETER = OpenApiParameter(
    "scope",
    str,
    required=True,
    many=True,
    description='The scope: repeated (?scope=user&scope=alice) or a JSON list (?scope=["user","alice"]).',
)
SCOPE_OPTIONAL = OpenApiParameter(
    "scope", str, many=True, description="The fact's scope, to check it (optional)."
)
CATEGORY_PARAMETER = OpenApiParameter("category", str, many=True, description="Only these.")
AT_PARAMETERS = [
    OpenApiParameter("as_of", str, description=AS_OF_HELP),
    OpenApiParameter("valid_at", str, description=VALID_AT_HELP),
]
API_SOURCE = {"kind": "api"}


class FactDecisionSerializer(serializers.Serializer):
    """Schema only: what the engine decided, and the fact it stored (if any)."""

    decision = serializers.DictField()
    fact = FactOutputSerializer(allow_null=True)


@extend_schema_serializer(component_name="ScopedFact")
class ScopedFactSerializer(FactOutputSerializer):
    """Schema only: a fact with the scope it belongs to."""

    scope = serializers.ListField(child=StrictCharField())

    class Meta(FactOutputSerializer.Meta):
        fields = [*FactOutputSerializer.Meta.fields, "scope"]


def _owner(request: Request) -> AbstractBaseUser:
    return cast(AbstractBaseUser, request.user)  # authenticated: the API's default permission


def _engine(request: Request, values: dict[str, Any] | None = None) -> MemoryEngine:
    filled = dict(values or {})
    header = user_header_value(request)
    if header and not filled.get("user_id"):
        filled["user_id"] = header
    return MemoryEngine(owner=_owner(request), values=filled)


def _query_scope(request: Request, engine: MemoryEngine, *, required: bool) -> ScopePath | None:
    """``?scope=user&scope=alice`` or ``?scope=["user","alice"]``."""
    raw = request.query_params.getlist("scope")
    if not raw:
        if required:
            raise InvalidInput("scope is required", details={"scope": "required"})
        return None
    if len(raw) == 1 and raw[0].startswith("["):
        try:
            raw = json.loads(raw[0])
        except ValueError:
            raise InvalidInput("scope is not a JSON list", details={"scope": "invalid"}) from None
    return engine.scope(raw)


def _validated(serializer_class: type, data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class FactsView(APIView):
    @extend_schema(
        summary="List a scope's facts",
        parameters=[SCOPE_PARAMETER, CATEGORY_PARAMETER, *AT_PARAMETERS],
        responses={200: paginated(FactOutputSerializer), 400: ERROR, 404: ERROR},
        description="Current facts, or with as_of / valid_at the versions of that time.",
    )
    def get(self, request: Request) -> Response:
        engine = _engine(request, dict(request.query_params.items()))
        at = at_from(request.query_params.get("as_of"), request.query_params.get("valid_at"))
        row = engine.existing(cast(ScopePath, _query_scope(request, engine, required=True)))
        categories = request.query_params.getlist("category") or None
        unknown = sorted(set(categories or ()) - set(CATEGORIES))
        if unknown:  # (as the search's filter.category: a 400, not an empty list)
            said = f"unknown {', '.join(unknown)}; the categories are {', '.join(CATEGORIES)}"
            raise InvalidInput(f"category: {said}", details={"category": said})
        filter = FactFilter(categories=categories)
        qs: Any = (
            fact_list(scope=row, filter=filter)
            if at is None
            else timeline_list(scope=row, at=at, filter=filter)
        )
        return paginated_response(self, request, qs, FactOutputSerializer)

    @extend_schema(
        summary="Add a fact (the engine decides: add, replace or ignore)",
        request=FactCreateSerializer,
        responses={201: FactDecisionSerializer, 200: FactDecisionSerializer, 409: ERROR},
        description="201 when a fact was added or replaced, 200 when it was ignored "
        "(a duplicate or below ENGINE_MIN_CONFIDENCE): the decision says which.",
    )
    def post(self, request: Request) -> Response:
        data = _validated(FactCreateSerializer, request.data)
        engine = _engine(request, data["scope_values"])
        result = engine.manage(
            data["scope"], data["content"], category=data["category"],
            confidence=data["confidence"], reason=data["reason"],
            source_kind=data["source_kind"], source_ref=data["source_ref"],
            metadata=data["metadata"], validity=data["validity"], source=API_SOURCE,
        )  # fmt: skip
        fact = fact_find(owner=_owner(request), fact_id=result.fact_id)
        body = {
            "decision": DecisionSerializer(result.decision).data,
            "fact": FactOutputSerializer(fact).data if fact is not None else None,
        }
        created = result.action in ("add", "replace")
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class FactDetailView(APIView):
    def _scope(self, request: Request) -> ScopePath | None:
        engine = _engine(request, dict(request.query_params.items()))
        return _query_scope(request, engine, required=False)

    @extend_schema(
        summary="Get a fact", parameters=[SCOPE_OPTIONAL], responses=ScopedFactSerializer
    )
    def get(self, request: Request, fact_id: uuid.UUID) -> Response:
        fact, row = fact_resolve(owner=_owner(request), fact_id=fact_id, scope=self._scope(request))
        return Response({**FactOutputSerializer(fact).data, "scope": row.path})

    @extend_schema(
        summary="Change a fact",
        parameters=[SCOPE_OPTIONAL],
        request=FactUpdateSerializer,
        responses={200: ScopedFactSerializer, 409: ERROR},
    )
    def patch(self, request: Request, fact_id: uuid.UUID) -> Response:
        scope = self._scope(request)
        data = _validated(FactUpdateSerializer, request.data)
        _, row = fact_resolve(owner=_owner(request), fact_id=fact_id, scope=scope)
        result = _engine(request).manage(
            row.path, data.get("content"), action="update", id=fact_id,
            category=data.get("category"), confidence=data.get("confidence"),
            reason=data["reason"], validity=data["validity"], source=API_SOURCE,
        )  # fmt: skip
        return Response({**FactOutputSerializer(result.fact).data, "scope": row.path})

    @extend_schema(summary="Delete a fact", parameters=[SCOPE_OPTIONAL], responses={204: None})
    def delete(self, request: Request, fact_id: uuid.UUID) -> Response:
        _, row = fact_resolve(owner=_owner(request), fact_id=fact_id, scope=self._scope(request))
        _engine(request).manage(row.path, action="delete", id=fact_id, source=API_SOURCE)
        return Response(status=status.HTTP_204_NO_CONTENT)


class FactHistoryView(APIView):
    @extend_schema(
        summary="A fact's history",
        parameters=[SCOPE_OPTIONAL],
        responses={200: FactHistoryOutputSerializer, 404: ERROR},
        description="Its versions, oldest first (the current one last, closed_by null): "
        "what closed each (action, reason, source, successor). Any id of its lineage "
        "(a fact it replaced, or one that replaced it) gives the whole of it.",
    )
    def get(self, request: Request, fact_id: uuid.UUID) -> Response:
        return history_response(_owner(request), fact_id, _scope_row(request, fact_id))


def _scope_row(request: Request, fact_id: uuid.UUID) -> Any:
    """The scope a history is read in: the one named, else the fact's (a current one),
    else the scope of its closed versions."""
    engine = _engine(request, dict(request.query_params.items()))
    scope = _query_scope(request, engine, required=False)
    if scope is not None:
        return engine.existing(scope)
    try:
        return fact_resolve(owner=_owner(request), fact_id=fact_id)[1]
    except FactNotFound:
        return version_scope(owner=_owner(request), fact_id=fact_id)


class SearchView(APIView):
    reads = True  # a read-only key may POST here (core.api.permissions)

    @extend_schema(
        summary="Search a scope's facts",
        request=SearchSerializer,
        responses={200: SearchOutputSerializer, 404: ERROR},
    )
    def post(self, request: Request) -> Response:
        data = _validated(SearchSerializer, request.data)
        engine = _engine(request, data["scope_values"])
        result = engine.search(
            data["scope"], data["query"], limit=data["limit"], offset=data["offset"],
            filter=data.get("filter"), half_life_days=data.get("half_life_days"), must_exist=True,
            at=data["at"],
        )  # fmt: skip
        return Response(
            {
                "scope": list(engine.scope(data["scope"])),
                "mode": result.mode,
                "results": HitSerializer(result.hits, many=True).data,
            }
        )


class InjectionView(APIView):
    reads = True  # a read-only key may POST here (core.api.permissions)

    @extend_schema(
        summary="The memory block to inject for a scope",
        request=InjectionSerializer,
        responses={200: OpenApiTypes.OBJECT, 404: ERROR},
    )
    def post(self, request: Request) -> Response:
        data = _validated(InjectionSerializer, request.data)
        engine = _engine(request, data["scope_values"])
        block = engine.format_for_injection(
            data["scope"],
            data["max_tokens"],
            query=data.get("query") or None,
            must_exist=True,
            at=data["at"],
        )
        return Response({"scope": list(engine.scope(data["scope"])), **injection_payload(block)})


class ErasedScopeSerializer(serializers.Serializer):
    """Schema only: the scope erased and how many facts it held."""

    scope = serializers.ListField(child=StrictCharField())
    facts_removed = StrictIntegerField()


class EraseView(APIView):
    @extend_schema(
        summary="Erase a scope",
        request=ScopedSerializer,
        responses={200: ErasedScopeSerializer, 404: ERROR},
    )
    def post(self, request: Request) -> Response:
        """Erase a scope and everything of it (facts, audit, pending updates, dreams,
        summaries, journal, MEMORY.md, diaries)."""
        data = _validated(ScopedSerializer, request.data)
        engine = _engine(request, data["scope_values"])
        removed = engine.erase(data["scope"])
        return Response({"scope": list(engine.scope(data["scope"])), "facts_removed": removed})
