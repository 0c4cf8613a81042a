from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import PageNumberPagination
from ingestion.api.serializers import (
    FlowInSerializer,
    FlowOutputSerializer,
    FlushInSerializer,
    JobOutputSerializer,
    MemoryBaseCreateSerializer,
    MemoryBaseOutputSerializer,
    MemoryBaseUpdateSerializer,
    MessageOutputSerializer,
    MessageQuerySerializer,
    RunInSerializer,
    SessionIdField,
    SessionOutputSerializer,
    SingleMessageInSerializer,
    content_to_text,
)
from ingestion.models import Flow, IngestionJob, MemoryBase
from ingestion.selectors import (
    flow_get,
    flow_list,
    job_get,
    memory_base_get,
    memory_base_list,
    memory_base_sessions,
    message_list,
)
from ingestion.services import (
    MessageIn,
    flow_create,
    memory_base_create,
    memory_base_delete,
    memory_base_flush,
    memory_base_regenerate,
    memory_base_update,
    messages_record,
    session_messages_delete,
)


def _paginate(view: APIView, request: Request, qs: Any, serializer: Any) -> Response:
    paginator = PageNumberPagination()
    page = paginator.paginate_queryset(qs, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)


def _flow(request: Request, flow_id: Any) -> Flow:
    return flow_get(owner=request.user, flow_id=flow_id)


def _memory_base(request: Request, mb_id: Any) -> MemoryBase:
    return memory_base_get(owner=request.user, memory_base_id=mb_id)


def _message_in(data: dict[str, Any]) -> MessageIn:
    text, blocks = content_to_text(data["content"])
    return MessageIn(
        role=data["role"], text=text, content=blocks, is_output=data.get("is_output"),
        sender=data.get("sender", ""), sender_name=data.get("sender_name", ""),
        files=data.get("files") or [], parent_id=data.get("parent_message_id"),
    )  # fmt: skip


class FlowListView(APIView):
    @extend_schema(responses=FlowOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        return _paginate(self, request, flow_list(owner=request.user), FlowOutputSerializer)

    @extend_schema(request=FlowInSerializer, responses={201: FlowOutputSerializer})
    def post(self, request: Request) -> Response:
        data = FlowInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        flow = flow_create(owner=request.user, name=data.validated_data["name"])
        return Response(FlowOutputSerializer(flow).data, status=status.HTTP_201_CREATED)


class FlowDetailView(APIView):
    @extend_schema(responses=FlowOutputSerializer)
    def get(self, request: Request, flow_id: Any) -> Response:
        return Response(FlowOutputSerializer(_flow(request, flow_id)).data)


class FlowRunView(APIView):
    @extend_schema(request=RunInSerializer, responses={201: MessageOutputSerializer(many=True)})
    def post(self, request: Request, flow_id: Any) -> Response:
        flow = _flow(request, flow_id)
        data = RunInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        stored = messages_record(
            flow=flow,
            session_id=data.validated_data["session_id"],
            run_id=data.validated_data["run_id"],
            messages=[_message_in(m) for m in data.validated_data["messages"]],
        )
        return Response(
            {"messages": MessageOutputSerializer(stored, many=True).data},
            status=status.HTTP_201_CREATED,
        )


class FlowSessionMessagesView(APIView):
    @extend_schema(description="Delete a session's messages and purge its memory-base chunks.")
    def delete(self, request: Request, flow_id: Any, session_id: str) -> Response:
        flow = _flow(request, flow_id)
        SessionIdField().run_validation(session_id)
        deleted = session_messages_delete(flow=flow, session_id=session_id)
        return Response({"deleted": deleted})


class MessageListView(APIView):
    @extend_schema(
        responses=MessageOutputSerializer(many=True), parameters=[MessageQuerySerializer]
    )
    def get(self, request: Request) -> Response:
        query = MessageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        memory_base = (
            _memory_base(request, params["memory_base_id"]) if "memory_base_id" in params else None
        )
        flow = _flow(request, params["flow"]) if "flow" in params else None
        qs = message_list(
            owner=request.user,
            session_id=params.get("session_id"),
            flow=flow,
            memory_base=memory_base,
        )
        return _paginate(self, request, qs, MessageOutputSerializer)

    @extend_schema(request=SingleMessageInSerializer, responses={201: MessageOutputSerializer})
    def post(self, request: Request) -> Response:
        data = SingleMessageInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        flow = _flow(request, data.validated_data["flow"])
        (message,) = messages_record(
            flow=flow,
            session_id=data.validated_data["session_id"],
            run_id=data.validated_data["run_id"],
            messages=[_message_in(data.validated_data)],
        )
        return Response(MessageOutputSerializer(message).data, status=status.HTTP_201_CREATED)


class MemoryBaseListView(APIView):
    @extend_schema(responses=MemoryBaseOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        return _paginate(
            self, request, memory_base_list(owner=request.user), MemoryBaseOutputSerializer
        )

    @extend_schema(request=MemoryBaseCreateSerializer, responses={201: MemoryBaseOutputSerializer})
    def post(self, request: Request) -> Response:
        data = MemoryBaseCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        flow = _flow(request, values.pop("flow"))
        mb = memory_base_create(owner=request.user, flow=flow, **values)
        return Response(
            MemoryBaseOutputSerializer(_memory_base(request, mb.pk)).data,
            status=status.HTTP_201_CREATED,
        )


class MemoryBaseDetailView(APIView):
    @extend_schema(responses=MemoryBaseOutputSerializer)
    def get(self, request: Request, mb_id: Any) -> Response:
        return Response(MemoryBaseOutputSerializer(_memory_base(request, mb_id)).data)

    @extend_schema(request=MemoryBaseUpdateSerializer, responses=MemoryBaseOutputSerializer)
    def patch(self, request: Request, mb_id: Any) -> Response:
        mb = _memory_base(request, mb_id)
        data = MemoryBaseUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        memory_base_update(memory_base=mb, **data.validated_data)
        return Response(MemoryBaseOutputSerializer(_memory_base(request, mb_id)).data)

    def delete(self, request: Request, mb_id: Any) -> Response:
        memory_base_delete(memory_base=_memory_base(request, mb_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemoryBaseSessionsView(APIView):
    @extend_schema(responses=SessionOutputSerializer(many=True))
    def get(self, request: Request, mb_id: Any) -> Response:
        mb = _memory_base(request, mb_id)
        return _paginate(
            self, request, memory_base_sessions(memory_base=mb), SessionOutputSerializer
        )


class MemoryBaseJobsView(APIView):
    """Queue jobs for all sessions or one: ``flush`` (ingest pending outputs now,
    ignoring the threshold) or ``regenerate`` (clear and re-ingest from the start)."""

    service = staticmethod(memory_base_flush)

    @extend_schema(request=FlushInSerializer, responses={202: JobOutputSerializer(many=True)})
    def post(self, request: Request, mb_id: Any) -> Response:
        mb = _memory_base(request, mb_id)
        data = FlushInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        jobs = self.service(memory_base=mb, session_id=data.validated_data.get("session_id"))
        return Response({"jobs": _jobs_out(jobs)}, status=status.HTTP_202_ACCEPTED)


class MemoryBaseFlushView(MemoryBaseJobsView):
    service = staticmethod(memory_base_flush)


class MemoryBaseRegenerateView(MemoryBaseJobsView):
    service = staticmethod(memory_base_regenerate)


def _jobs_out(jobs: list[IngestionJob]) -> list[dict[str, Any]]:
    fresh = IngestionJob.objects.select_related("session").filter(pk__in=[j.pk for j in jobs])
    by_id = {job.pk: job for job in fresh}
    return JobOutputSerializer([by_id[j.pk] for j in jobs], many=True).data


class JobDetailView(APIView):
    @extend_schema(responses=JobOutputSerializer)
    def get(self, request: Request, job_id: Any) -> Response:
        job = job_get(owner=request.user, job_id=job_id)
        return Response(JobOutputSerializer(job).data)
