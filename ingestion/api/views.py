"""Capture endpoints: a flow's runs and single messages (and listing them)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import paginated_response
from core.api.schema import ERROR, paginated, wrapped
from core.errors import InvalidInput
from ingestion.api.serializers import (
    MessageQuerySerializer,
    RunInSerializer,
    SingleMessageInSerializer,
)
from memories.bases.selectors import memory_base_get
from memories.bases.services import messages_record
from memories.conversations.api.serializers import MessageOutputSerializer, content_to_text
from memories.conversations.api.views import flow_for
from memories.conversations.selectors import message_list
from memories.conversations.services import PREVIOUS, MessageIn


def _message_in(data: dict[str, Any]) -> MessageIn:
    text, blocks = content_to_text(data["content"])
    return MessageIn(
        role=data["role"],
        text=text,
        content=blocks,
        is_output=data.get("is_output"),
        sender=data.get("sender", ""),
        sender_name=data.get("sender_name", ""),
        files=data.get("files") or [],
        message_id=data.get("message_id"),
        parent=data.get("parent_message_id", PREVIOUS),
    )


def _run_messages(messages: list[dict[str, Any]]) -> list[MessageIn]:
    """A run's messages to record: OpenAI's tool-calling steps passed over
    (``MessageInSerializer``); a message naming a step as its parent follows that
    step's own parent."""
    kept: list[MessageIn] = []
    through: dict[str, Any] = {}
    for message in messages:
        parent = message.get("parent_message_id", PREVIOUS)
        if isinstance(parent, str) and parent is not PREVIOUS:
            parent = through.get(parent, parent)
        if message["tool_step"]:
            if message.get("message_id"):
                # "the message before the step": the last kept one, named if it can be
                # (a message in between would otherwise become the parent)
                before = kept[-1].message_id if kept and parent is PREVIOUS else None
                through[message["message_id"]] = before or parent
            continue
        kept.append(_message_in({**message, "parent_message_id": parent}))
    if not kept:
        raise InvalidInput(
            "The run holds only tool-calling steps, which are not recorded: send the "
            "question and the final answer.",
            details={"messages": "only tool-calling steps"},
        )
    return kept


class FlowRunView(APIView):
    @extend_schema(
        summary="Record a run's messages",
        request=RunInSerializer,
        responses={201: wrapped("messages", MessageOutputSerializer), 409: ERROR, 422: ERROR},
    )
    def post(self, request: Request, flow_id: Any) -> Response:
        flow = flow_for(request, flow_id)
        data = RunInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        stored = messages_record(
            flow=flow,
            session_id=data.validated_data["session_id"],
            run_id=data.validated_data["run_id"],
            messages=_run_messages(data.validated_data["messages"]),
        )
        return Response(
            {"messages": MessageOutputSerializer(stored, many=True).data},
            status=status.HTTP_201_CREATED,
        )


class MessageListView(APIView):
    @extend_schema(
        summary="List messages",
        responses=paginated(MessageOutputSerializer),
        parameters=[MessageQuerySerializer],
    )
    def get(self, request: Request) -> Response:
        query = MessageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        flow_ids = set()
        if "memory_base_id" in params:  # a memory base resolves to its flow
            mb = memory_base_get(owner=request.user, memory_base_id=params["memory_base_id"])
            flow_ids.add(mb.flow_id)
        if "flow" in params:
            flow_ids.add(flow_for(request, params["flow"]).pk)
        if len(flow_ids) > 1:  # (it answered an empty page, as if the flow had none)
            raise InvalidInput(
                "memory_base_id names a memory base of another flow than flow.",
                details={"memory_base_id": "a memory base of another flow than flow"},
            )
        qs = message_list(
            owner=request.user,
            session_id=params.get("session_id"),
            flow_id=next(iter(flow_ids)) if flow_ids else None,
        )
        return paginated_response(self, request, qs, MessageOutputSerializer)

    @extend_schema(
        summary="Record one message",
        request=SingleMessageInSerializer,
        responses={201: MessageOutputSerializer, 409: ERROR, 422: ERROR},
    )
    def post(self, request: Request) -> Response:
        data = SingleMessageInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if data.validated_data["tool_step"]:
            raise InvalidInput(
                "A tool-calling step is not recorded: record the question and the final "
                "answer (a run's list may hold its steps: they are passed over).",
                details={"tool_calls" if data.validated_data["role"] == "assistant"
                         else "tool_call_id": "a tool-calling step"},
            )  # fmt: skip
        flow = flow_for(request, data.validated_data["flow"])
        (message,) = messages_record(
            flow=flow,
            session_id=data.validated_data["session_id"],
            run_id=data.validated_data["run_id"],
            messages=[_message_in(data.validated_data)],
        )
        return Response(MessageOutputSerializer(message).data, status=status.HTTP_201_CREATED)
