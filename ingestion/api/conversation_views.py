"""Conversation history and node memory endpoints (thin: serializer -> service -> serializer)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import APISettings
from rest_framework.views import APIView

from ingestion.api.conversation_serializers import (
    ConversationHistoryQuerySerializer,
    FlowQuerySerializer,
    HistoryOutputSerializer,
    NodeHistoryOutputSerializer,
    NodeHistoryQuerySerializer,
    NodeTurnInSerializer,
    NodeTurnOutputSerializer,
)
from ingestion.api.views import _flow
from ingestion.conversation import History, conversation_history
from ingestion.node_memory import (
    LATEST,
    node_memory_append_turn,
    node_memory_clear,
    node_memory_history,
)


class HistoryFormatNegotiation(DefaultContentNegotiation):
    """``?format=messages|text`` chooses the history's shape here; DRF would otherwise
    read it as a renderer name and answer 404."""

    settings = APISettings({"URL_FORMAT_OVERRIDE": None})


def _query(serializer_class: type, request: Request) -> dict[str, Any]:
    query = serializer_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return dict(query.validated_data)


def _history_response(
    serializer_class: type[HistoryOutputSerializer], history: History, params: dict[str, Any]
) -> Response:
    context = {key: params[key] for key in ("format", "human_prefix", "ai_prefix")}
    return Response(serializer_class(history, context=context).data)


class ConversationHistoryView(APIView):
    content_negotiation_class = HistoryFormatNegotiation

    @extend_schema(
        parameters=[ConversationHistoryQuerySerializer],
        responses=HistoryOutputSerializer,
        description="The current thread of a conversation (flow + session), newest kept, "
        "cut to max_tokens.",
    )
    def get(self, request: Request, session_id: str) -> Response:
        params = _query(ConversationHistoryQuerySerializer, request)
        flow = _flow(request, params["flow"])
        history = conversation_history(
            flow=flow,
            session_id=session_id,
            current_message_id=params.get("current_message_id"),
            max_tokens=params["max_tokens"],
            message_limit=params["message_limit"],
        )
        return _history_response(HistoryOutputSerializer, history, params)


class NodeTurnsView(APIView):
    @extend_schema(request=NodeTurnInSerializer, responses={201: NodeTurnOutputSerializer})
    def post(self, request: Request, session_id: str, node_id: str) -> Response:
        data = NodeTurnInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        flow = _flow(request, values.pop("flow"))
        turn = node_memory_append_turn(
            flow=flow,
            session_id=session_id,
            node_id=node_id,
            parent_message_id=values.pop("parent_message_id", LATEST),
            **values,
        )
        return Response(
            NodeTurnOutputSerializer(turn).data,
            status=status.HTTP_201_CREATED if turn.created else status.HTTP_200_OK,
        )


class NodeHistoryView(APIView):
    content_negotiation_class = HistoryFormatNegotiation

    @extend_schema(parameters=[NodeHistoryQuerySerializer], responses=NodeHistoryOutputSerializer)
    def get(self, request: Request, session_id: str, node_id: str) -> Response:
        params = _query(NodeHistoryQuerySerializer, request)
        flow = _flow(request, params["flow"])
        history = node_memory_history(
            flow=flow,
            session_id=session_id,
            node_id=node_id,
            current_message_id=params.get("current_message_id"),
            max_tokens=params["max_tokens"],
        )
        return _history_response(NodeHistoryOutputSerializer, history, params)


class NodeMemoryView(APIView):
    @extend_schema(parameters=[FlowQuerySerializer], responses={204: None})
    def delete(self, request: Request, session_id: str, node_id: str) -> Response:
        flow = _flow(request, _query(FlowQuerySerializer, request)["flow"])
        node_memory_clear(flow=flow, session_id=session_id, node_id=node_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
