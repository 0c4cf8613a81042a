from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import PageNumberPagination
from core.api.schema import paginated
from core.api.serializers import (
    APIKeyCreatedSerializer,
    APIKeyCreateInputSerializer,
    APIKeyOutputSerializer,
    MeSerializer,
    MeUpdateSerializer,
    UsageQuerySerializer,
    UsageSerializer,
)
from core.key_limits import key_limits_payload
from core.models import APIKey, UsageBudget
from core.selectors import USAGE_GROUPS, api_key_get, api_key_list, usage_summary
from core.services import api_key_create, api_key_revoke
from core.usage import budget_of, budget_set


def _me(request: Request) -> dict[str, Any]:
    user: Any = request.user  # (authenticated: the permission classes ran)
    own = UsageBudget.objects.filter(owner=user).values_list("daily_tokens", flat=True).first()
    key = request.auth if isinstance(request.auth, APIKey) else None
    limits = None if key is None else {
        "id": key.pk, "prefix": key.prefix, "read_only": key.read_only,
        "expires_at": key.expires_at, "limits": key_limits_payload(key),
    }  # fmt: skip
    return {"id": user.pk, "username": user.username, "background_daily_tokens": own,
            "key": limits}  # fmt: skip


class MeView(APIView):
    owner_wide = ("PATCH",)  # not to a narrowed key (core.key_limits)

    @extend_schema(summary="Who the key belongs to", responses=MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(MeSerializer(_me(request)).data)

    @extend_schema(
        summary="Set your daily token budget for background work",
        request=MeUpdateSerializer,
        responses=MeSerializer,
    )
    def patch(self, request: Request) -> Response:
        data = MeUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        budget_set(owner_id=request.user.pk,
                   daily_tokens=data.validated_data["background_daily_tokens"])  # fmt: skip
        return Response(MeSerializer(_me(request)).data)


class UsageView(APIView):
    owner_wide = ("GET",)  # not to a narrowed key (core.key_limits)

    @extend_schema(
        summary="Your LLM and embedding usage",
        description="Tokens your work spent, per day (UTC) and grouped as asked: extraction, "
        "dreams, context summaries, Memory Base outputs, query rewriting, the chat proxy's "
        "upstream answers and tool loops, remote embeddings. Default: the last 30 days, by "
        "day and kind.",
        parameters=[
            OpenApiParameter("from", OpenApiTypes.DATE, description="First day (default: 29 "
                             "days before to)."),
            OpenApiParameter("to", OpenApiTypes.DATE, description="Last day (default: today)."),
            OpenApiParameter("group_by", str, description="Comma-separated, each once: "
                             + ", ".join(USAGE_GROUPS) + " (default day,kind)."),
        ],
        responses=UsageSerializer,
    )  # fmt: skip
    def get(self, request: Request) -> Response:
        given = request.query_params
        query = {
            "start": given.get("from"),
            "end": given.get("to"),
            "group_by": given.get("group_by"),
        }
        data = UsageQuerySerializer(data={k: v for k, v in query.items() if v is not None})
        if not data.is_valid():  # (errors named as the query names them)
            names = {"start": "from", "end": "to"}
            raise ValidationError({names.get(k, k): v for k, v in data.errors.items()})
        start, end = data.validated_data["start"], data.validated_data["end"]
        group_by = data.validated_data["group_by"]
        totals, rows = usage_summary(owner=request.user, start=start, end=end, group_by=group_by)
        budget = budget_of(request.user.pk)
        body = {
            "from": start, "to": end, "group_by": group_by, "totals": totals, "results": rows,
            "budget": {
                "daily_tokens": budget.daily_tokens, "spent_today": budget.spent,
                "resets_at": budget.resets_at, "deferred_runs_today": budget.deferred_runs,
                "last_deferred_at": budget.deferred_at,
            },
        }  # fmt: skip
        return Response(body)


class APIKeyListView(APIView):
    owner_wide = ("GET", "POST")  # not to a narrowed key (core.key_limits)

    @extend_schema(summary="List your API keys", responses=paginated(APIKeyOutputSerializer))
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(api_key_list(owner=request.user), request, view=self)
        return paginator.get_paginated_response(APIKeyOutputSerializer(page, many=True).data)

    @extend_schema(
        summary="Create an API key (shown once)",
        request=APIKeyCreateInputSerializer,
        responses={201: APIKeyCreatedSerializer},
    )
    def post(self, request: Request) -> Response:
        data = APIKeyCreateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        api_key, raw_key = api_key_create(owner=request.user, **data.validated_data)
        body = APIKeyOutputSerializer(api_key).data | {"key": raw_key}
        return Response(body, status=status.HTTP_201_CREATED)


class APIKeyDetailView(APIView):
    owner_wide = ("GET", "DELETE")  # not to a narrowed key (core.key_limits)

    def _get(self, request: Request, key_id: int) -> APIKey:
        try:
            return api_key_get(owner=request.user, key_id=key_id)
        except APIKey.DoesNotExist:
            raise Http404 from None

    @extend_schema(summary="Get an API key", responses=APIKeyOutputSerializer)
    def get(self, request: Request, key_id: int) -> Response:
        return Response(APIKeyOutputSerializer(self._get(request, key_id)).data)

    @extend_schema(
        summary="Revoke an API key",
        responses={200: APIKeyOutputSerializer},
        description="Revoke the key; the answer is the revoked key (revoked_at set).",
    )
    def delete(self, request: Request, key_id: int) -> Response:
        api_key = api_key_revoke(api_key=self._get(request, key_id))
        return Response(APIKeyOutputSerializer(api_key).data)
