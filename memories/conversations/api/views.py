"""Conversation history and node memory endpoints (thin: serializer -> service -> serializer)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import APISettings
from rest_framework.views import APIView

from core.api.pagination import paginated_response
from core.api.permissions import refuse_read_only
from core.api.schema import ERROR, paginated
from memories.conversations.api.serializers import (
    ConversationHistoryAnswerSerializer,
    ConversationHistoryOutputSerializer,
    ConversationHistoryQuerySerializer,
    FlowInSerializer,
    FlowOutputSerializer,
    FlowQuerySerializer,
    HistoryOutputSerializer,
    NodeHistoryOutputSerializer,
    NodeHistoryQuerySerializer,
    NodeTurnInSerializer,
    NodeTurnOutputSerializer,
    SummarizedHistoryOutputSerializer,
)
from memories.conversations.history import History, conversation_history
from memories.conversations.models import Flow
from memories.conversations.node_memory import (
    LATEST,
    NodeMemoryNotFound,
    node_memory_append_turn,
    node_memory_clear,
    node_memory_history,
)
from memories.conversations.selectors import flow_get, flow_list, session_has_messages
from memories.conversations.services import flow_create
from memories.conversations.summaries import conversation_history_summarized


def flow_for(request: Request, flow_id: Any) -> Flow:
    return flow_get(owner=request.user, flow_id=flow_id)


class FlowListView(APIView):
    @extend_schema(summary="List flows", responses=paginated(FlowOutputSerializer))
    def get(self, request: Request) -> Response:
        return paginated_response(
            self, request, flow_list(owner=request.user), FlowOutputSerializer
        )

    @extend_schema(
        summary="Create a flow",
        request=FlowInSerializer,
        responses={201: FlowOutputSerializer, 409: ERROR},
    )
    def post(self, request: Request) -> Response:
        data = FlowInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        flow = flow_create(owner=request.user, name=data.validated_data["name"])
        return Response(FlowOutputSerializer(flow).data, status=status.HTTP_201_CREATED)


class FlowDetailView(APIView):
    @extend_schema(summary="Get a flow", responses=FlowOutputSerializer)
    def get(self, request: Request, flow_id: Any) -> Response:
        return Response(FlowOutputSerializer(flow_for(request, flow_id)).data)


class HistoryFormatNegotiation(DefaultContentNegotiation):
    """``?format=messages|text`` chooses the history's shape here; DRF would otherwise
    read it as a renderer name and answer 404."""

    settings = APISettings({"URL_FORMAT_OVERRIDE": None})  # type: ignore[assignment]


def _query(serializer_class: type, request: Request) -> dict[str, Any]:
    query = serializer_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return dict(query.validated_data)


def _history_response(
    serializer_class: type[HistoryOutputSerializer], history: History, params: dict[str, Any]
) -> Response:
    context = {key: params[key] for key in ("format", "human_prefix", "ai_prefix")}
    return Response(serializer_class(history, context=context).data)


def _summarizes(request: HttpRequest) -> bool:
    """A history asked with ``strategy=summarize`` stores the running summary: it reads
    the summary's state from the primary, where it writes (``core.replicas``)."""
    return request.GET.get("strategy") == "summarize"


class ConversationHistoryView(APIView):
    content_negotiation_class = HistoryFormatNegotiation
    get_writes = staticmethod(_summarizes)

    @extend_schema(
        summary="A conversation's history",
        parameters=[ConversationHistoryQuerySerializer],
        # 502, 504: strategy=summarize asks the chat LLM; 409: the conversation was
        # deleted while its summary was made
        responses={
            200: ConversationHistoryAnswerSerializer,
            409: ERROR,
            422: ERROR,
            502: ERROR,
            504: ERROR,
        },  # fmt: skip
        description="The current thread of a conversation (flow + session), cut to "
        "max_tokens by whole turns, newest kept; an empty conversation has an empty history; "
        "with strategy=summarize the older messages are folded into the conversation's "
        "running summary instead of dropped (that stores the summary: a read-only key's "
        "strategy=summarize is a 403 read_only_key).",
    )
    def get(self, request: Request, session_id: str) -> Response:
        return _conversation_history(request, session_id)


def _conversation_history(request: Request, session_id: str) -> Response:
    """A conversation's history, as its route answers it (the node route's too, for a
    session id holding "/nodes/")."""
    params = _query(ConversationHistoryQuerySerializer, request)
    if params["strategy"] == "summarize":
        # it stores the running summary and spends LLM tokens: a write, by GET
        refuse_read_only(request)
    thread = {
        "flow": flow_for(request, params["flow"]),
        "session_id": session_id,
        "current_message_id": params.get("current_message_id"),
        "max_tokens": params["max_tokens"],
        "message_limit": params["message_limit"],
    }
    if params["strategy"] == "summarize":
        summarized = conversation_history_summarized(
            **thread,
            max_tokens_before_summary=params.get("max_tokens_before_summary"),
            max_summary_tokens=params["max_summary_tokens"],
        )
        return _history_response(SummarizedHistoryOutputSerializer, summarized, params)
    history = conversation_history(**thread)
    return _history_response(ConversationHistoryOutputSerializer, history, params)


class NodeTurnsView(APIView):
    @extend_schema(
        summary="Append a turn to a node's memory",
        request=NodeTurnInSerializer,
        responses={
            201: NodeTurnOutputSerializer,
            200: NodeTurnOutputSerializer,
            409: ERROR,
            422: ERROR,
        },
        description="201 for a new turn, 200 when the same turn was stored already.",
    )
    def post(self, request: Request, session_id: str, node_id: str) -> Response:
        data = NodeTurnInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        flow = flow_for(request, values.pop("flow"))
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
    get_writes = staticmethod(_summarizes)  # (a session's history when no such node)

    @extend_schema(
        summary="A node's history",
        parameters=[NodeHistoryQuerySerializer],
        # (a session id holding "/nodes/" is answered that conversation's history, which
        # strategy=summarize may fold: 409, 502, 504 as there)
        responses={
            200: NodeHistoryOutputSerializer,
            409: ERROR,
            422: ERROR,
            502: ERROR,
            504: ERROR,
        },  # fmt: skip
    )
    def get(self, request: Request, session_id: str, node_id: str) -> Response:
        params = _query(NodeHistoryQuerySerializer, request)
        flow = flow_for(request, params["flow"])
        try:
            history = node_memory_history(
                flow=flow,
                session_id=session_id,
                node_id=node_id,
                current_message_id=params.get("current_message_id"),
                max_tokens=params["max_tokens"],
            )
        except NodeMemoryNotFound:
            # A session id may hold "/nodes/" ("team/nodes/x"): its history's path is
            # this route's. Without node x in conversation "team", it is that session's.
            whole = f"{session_id}/nodes/{node_id}"
            if not session_has_messages(flow_id=flow.pk, session_id=whole):
                raise
            return _conversation_history(request, whole)
        return _history_response(NodeHistoryOutputSerializer, history, params)


class NodeMemoryView(APIView):
    @extend_schema(
        summary="Clear a node's memory", parameters=[FlowQuerySerializer], responses={204: None}
    )
    def delete(self, request: Request, session_id: str, node_id: str) -> Response:
        flow = flow_for(request, _query(FlowQuerySerializer, request)["flow"])
        node_memory_clear(flow=flow, session_id=session_id, node_id=node_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
