"""Memory store endpoints (thin: serializer -> service -> serializer)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import paginated_response
from core.api.parsers import JSONParser
from core.api.schema import ERROR, paginated, wrapped
from core.errors import InvalidInput
from core.validation import validate_node_id
from memories.conversations.models import Flow
from memories.conversations.selectors import flow_get
from memories.stores.api.parsers import TextYAMLParser, XYAMLParser, YAMLParser, YAMLRenderer
from memories.stores.api.serializers import (
    AttachmentOutputSerializer,
    ConfigQuerySerializer,
    ItemOutputSerializer,
    ItemQuerySerializer,
    RetrieveInSerializer,
    RetrieveOutputSerializer,
    StoreCreateSerializer,
    StoreErrorSerializer,
    StoreOutputSerializer,
    StoreUpdateSerializer,
    WriteInSerializer,
    WriteOutputSerializer,
    WritesOutputSerializer,
)
from memories.stores.config import memory_config_apply, memory_config_export
from memories.stores.models import MemoryStore
from memories.stores.registry import store_types
from memories.stores.runtime import attachments_or_404, node_memory_retrieve, node_memory_write
from memories.stores.selectors import (
    memory_item_get,
    memory_item_list,
    memory_store_get,
    memory_store_list,
)
from memories.stores.services import (
    memory_item_delete,
    memory_store_create,
    memory_store_delete,
    memory_store_load,
    memory_store_update,
)


def _store(request: Request, store_id: Any) -> MemoryStore:
    return memory_store_get(owner=request.user, store_id=store_id)


def _flow(request: Request, flow_id: Any) -> Flow:
    return flow_get(owner=request.user, flow_id=flow_id)


class StoreTypesView(APIView):
    @extend_schema(
        summary="List store types",
        responses={200: OpenApiTypes.OBJECT},
        description="Registered store types with their summaries and config fields.",
    )
    def get(self, request: Request) -> Response:
        return Response(
            {
                "results": [
                    {
                        "name": kind.name,
                        "summary": kind.summary,
                        "read_only": kind.read_only,
                        "embeds": kind.embeds,
                        "config_fields": kind.field_specs(),
                    }
                    for kind in store_types()
                ]
            }
        )


class StoreListView(APIView):
    @extend_schema(summary="List memory stores", responses=paginated(StoreOutputSerializer))
    def get(self, request: Request) -> Response:
        return paginated_response(
            self, request, memory_store_list(owner=request.user), StoreOutputSerializer
        )

    @extend_schema(
        summary="Create a memory store",
        request=StoreCreateSerializer,
        responses={201: StoreOutputSerializer, 409: ERROR},
    )
    def post(self, request: Request) -> Response:
        data = StoreCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        store, load = memory_store_create(owner=request.user, **data.validated_data)
        body = StoreOutputSerializer(_store(request, store.pk)).data
        return Response({**body, "load": load}, status=status.HTTP_201_CREATED)


class StoreDetailView(APIView):
    @extend_schema(summary="Get a memory store", responses=StoreOutputSerializer)
    def get(self, request: Request, store_id: Any) -> Response:
        return Response(StoreOutputSerializer(_store(request, store_id)).data)

    @extend_schema(
        summary="Update a memory store",
        request=StoreUpdateSerializer,
        responses={200: StoreOutputSerializer, 409: ERROR},
    )
    def patch(self, request: Request, store_id: Any) -> Response:
        store = _store(request, store_id)
        data = StoreUpdateSerializer(data=request.data, context={"store": store})
        data.is_valid(raise_exception=True)
        store, load = memory_store_update(store=store, config=data.validated_data["config"])
        return Response({**StoreOutputSerializer(_store(request, store_id)).data, "load": load})

    @extend_schema(summary="Delete a memory store", responses={204: None})
    def delete(self, request: Request, store_id: Any) -> Response:
        memory_store_delete(store=_store(request, store_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class StoreLoadView(APIView):
    @extend_schema(
        summary="Re-index a file store",
        request=None,
        responses={200: OpenApiTypes.OBJECT, 409: ERROR},
        description="Re-index a file store's changed files now.",
    )
    def post(self, request: Request, store_id: Any) -> Response:
        return Response({"load": memory_store_load(store=_store(request, store_id))})


class StoreItemsView(APIView):
    @extend_schema(
        summary="List a store's items",
        parameters=[ItemQuerySerializer],
        responses=paginated(ItemOutputSerializer),
    )
    def get(self, request: Request, store_id: Any) -> Response:
        store = _store(request, store_id)
        query = ItemQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        items = memory_item_list(store=store, session_id=query.validated_data.get("session_id"))
        return paginated_response(self, request, items, ItemOutputSerializer)


class StoreItemDetailView(APIView):
    @extend_schema(summary="Get a store item", responses=ItemOutputSerializer)
    def get(self, request: Request, store_id: Any, item_id: int) -> Response:
        item = memory_item_get(store=_store(request, store_id), item_id=item_id)
        return Response(ItemOutputSerializer(item).data)

    @extend_schema(summary="Delete a store item", responses={204: None, 409: ERROR})
    def delete(self, request: Request, store_id: Any, item_id: int) -> Response:
        memory_item_delete(store=_store(request, store_id), item_id=item_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemoryConfigView(APIView):
    owner_wide = ("GET", "POST")  # not to a narrowed key (core.key_limits)
    """The owner's stores and node attachments as one document (JSON or YAML)."""

    parser_classes = [JSONParser, YAMLParser, TextYAMLParser, XYAMLParser]
    renderer_classes = [JSONRenderer, YAMLRenderer]

    @extend_schema(
        summary="Export stores and attachments",
        responses={
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "application/yaml"): OpenApiTypes.OBJECT,
            400: ERROR,
        },
        description="Export: `?format=yaml` (or Accept: application/yaml) for YAML "
        "(another format: 400).",
    )
    def get(self, request: Request) -> Response:
        formats = request.query_params.getlist("format")
        if formats and (len(formats) > 1 or formats[0] not in ("json", "yaml")):
            raise InvalidInput("format must be json or yaml.", details={"format": formats})
        unknown = sorted(set(request.query_params) - {"format"})
        if unknown:  # the export takes one parameter: a typo should not go unnoticed
            raise InvalidInput(f"Unknown query parameter(s): {', '.join(unknown)[:200]}.")
        return Response(memory_config_export(owner=request.user))

    @extend_schema(
        parameters=[ConfigQuerySerializer],
        summary="Apply a stores and attachments document",
        request={"application/json": OpenApiTypes.OBJECT, "application/yaml": OpenApiTypes.OBJECT},
        responses={
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "application/yaml"): OpenApiTypes.OBJECT,
            409: ERROR,
        },
    )
    def post(self, request: Request) -> Response:
        query = ConfigQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        result = memory_config_apply(
            owner=request.user, document=request.data, dry_run=query.validated_data["dry_run"]
        )
        return Response(result.as_dict())


class NodeMemoryView(APIView):
    @extend_schema(
        summary="A node's attached stores",
        responses=wrapped("attachments", AttachmentOutputSerializer),
    )
    def get(self, request: Request, flow_id: Any, node_id: str) -> Response:
        attachments = attachments_or_404(_flow(request, flow_id), validate_node_id(node_id))
        return Response({"attachments": AttachmentOutputSerializer(attachments, many=True).data})


class NodeMemoryRetrieveView(APIView):
    reads = True  # a read-only key may POST here (core.api.permissions)

    @extend_schema(
        summary="Retrieve from a node's stores",
        request=RetrieveInSerializer,
        responses={200: RetrieveOutputSerializer, 409: ERROR},
    )
    def post(self, request: Request, flow_id: Any, node_id: str) -> Response:
        flow = _flow(request, flow_id)
        data = RetrieveInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        result = node_memory_retrieve(flow=flow, node_id=node_id, **data.validated_data)
        return Response(RetrieveOutputSerializer(result).data)


class NodeMemoryWriteView(APIView):
    @extend_schema(
        summary="Write to a node's stores",
        request=WriteInSerializer,
        responses={200: WritesOutputSerializer, 409: ERROR},
        description="One result per store written; a store that cannot be written (an "
        "unset ${VAR}, its embedding endpoint down) is named in errors and the others are "
        "written.",
    )
    def post(self, request: Request, flow_id: Any, node_id: str) -> Response:
        flow = _flow(request, flow_id)
        data = WriteInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        results = node_memory_write(flow=flow, node_id=node_id, **data.validated_data)
        return Response({
            "results": WriteOutputSerializer(results, many=True).data,
            "errors": StoreErrorSerializer(results.errors, many=True).data,
        })  # fmt: skip
