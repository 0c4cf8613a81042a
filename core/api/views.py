from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import status
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
)
from core.models import APIKey
from core.selectors import api_key_get, api_key_list
from core.services import api_key_create, api_key_revoke


class MeView(APIView):
    @extend_schema(summary="Who the key belongs to", responses=MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(MeSerializer(request.user).data)


class APIKeyListView(APIView):
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
        api_key, raw_key = api_key_create(owner=request.user, name=data.validated_data["name"])
        body = APIKeyOutputSerializer(api_key).data | {"key": raw_key}
        return Response(body, status=status.HTTP_201_CREATED)


class APIKeyDetailView(APIView):
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
