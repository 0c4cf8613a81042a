from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import paginated_response
from core.api.schema import ERROR, DeletedSerializer, paginated, wrapped
from core.db_recovery import read_after_commit
from core.errors import NotFound
from knowledge.api.serializers import IngestJobAnswerSerializer, job_answer
from knowledge.selectors import ingest_job_get_by_id
from memories.bases.api.serializers import (
    FlushInSerializer,
    JobOutputSerializer,
    MemoryBaseCreateSerializer,
    MemoryBaseOutputSerializer,
    MemoryBaseUpdateSerializer,
    SessionOutputSerializer,
)
from memories.bases.models import MemoryBase, MemoryBaseJob
from memories.bases.selectors import (
    job_get,
    memory_base_as_created,
    memory_base_get,
    memory_base_list,
    memory_base_sessions,
)
from memories.bases.services import (
    memory_base_create,
    memory_base_delete,
    memory_base_flush,
    memory_base_regenerate,
    memory_base_update,
    session_messages_delete,
)
from memories.conversations.api.views import flow_for
from memories.conversations.models import Flow


def _memory_base(request: Request, mb_id: Any) -> MemoryBase:
    return memory_base_get(owner=request.user, memory_base_id=mb_id)


class FlowSessionMessagesView(APIView):
    @extend_schema(
        summary="Delete a session's messages",
        description="Delete a session's messages and purge its memory-base chunks.",
        responses={200: DeletedSerializer, 409: ERROR},
    )
    def delete(self, request: Request, flow_id: Any, session_id: str) -> Response:
        flow = flow_for(request, flow_id)
        deleted = session_messages_delete(flow=flow, session_id=session_id)
        return Response({"deleted": deleted})


class MemoryBaseListView(APIView):
    @extend_schema(summary="List memory bases", responses=paginated(MemoryBaseOutputSerializer))
    def get(self, request: Request) -> Response:
        return paginated_response(
            self, request, memory_base_list(owner=request.user), MemoryBaseOutputSerializer
        )

    @extend_schema(
        summary="Create a memory base",
        request=MemoryBaseCreateSerializer,
        responses={201: MemoryBaseOutputSerializer, 404: ERROR, 409: ERROR},
    )
    def post(self, request: Request) -> Response:
        data = MemoryBaseCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        flow_id = values.pop("flow")
        try:
            flow = flow_for(request, flow_id)
        except Flow.DoesNotExist:  # (the body names it: said, as a search's bases are)
            raise NotFound(f"flow {flow_id} not found", details={"flow": str(flow_id)}) from None
        mb = memory_base_create(owner=request.user, flow=flow, **values)
        # Committed: re-read with the counters, or answer from what create returned.
        out = read_after_commit(
            lambda: _memory_base(request, mb.pk), lambda: memory_base_as_created(mb)
        )
        return Response(MemoryBaseOutputSerializer(out).data, status=status.HTTP_201_CREATED)


class MemoryBaseDetailView(APIView):
    @extend_schema(summary="Get a memory base", responses=MemoryBaseOutputSerializer)
    def get(self, request: Request, mb_id: Any) -> Response:
        return Response(MemoryBaseOutputSerializer(_memory_base(request, mb_id)).data)

    @extend_schema(
        summary="Update a memory base",
        request=MemoryBaseUpdateSerializer,
        responses={200: MemoryBaseOutputSerializer, 400: ERROR, 409: ERROR},
    )
    def patch(self, request: Request, mb_id: Any) -> Response:
        mb = _memory_base(request, mb_id)
        data = MemoryBaseUpdateSerializer(data=request.data, context={"memory_base": mb})
        data.is_valid(raise_exception=True)
        memory_base_update(memory_base=mb, **data.validated_data)
        # Committed: re-read, or answer with the counters read before the update.
        out = read_after_commit(lambda: _memory_base(request, mb_id), lambda: mb)
        return Response(MemoryBaseOutputSerializer(out).data)

    @extend_schema(
        summary="Delete a memory base (its knowledge base too)", responses={204: None, 409: ERROR}
    )
    def delete(self, request: Request, mb_id: Any) -> Response:
        memory_base_delete(memory_base=_memory_base(request, mb_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemoryBaseSessionsView(APIView):
    @extend_schema(
        summary="List a memory base's sessions", responses=paginated(SessionOutputSerializer)
    )
    def get(self, request: Request, mb_id: Any) -> Response:
        mb = _memory_base(request, mb_id)
        return paginated_response(
            self, request, memory_base_sessions(memory_base=mb), SessionOutputSerializer
        )


class MemoryBaseJobsView(APIView):
    """Queue jobs for all sessions or one: ``flush`` (ingest pending outputs now,
    ignoring the threshold) or ``regenerate`` (clear and re-ingest from the start)."""

    service: Callable[..., list[MemoryBaseJob]] = staticmethod(memory_base_flush)

    @extend_schema(
        request=FlushInSerializer,
        responses={202: wrapped("jobs", JobOutputSerializer), 404: ERROR, 409: ERROR},
    )
    def post(self, request: Request, mb_id: Any) -> Response:
        mb = _memory_base(request, mb_id)
        data = FlushInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        jobs = self.service(memory_base=mb, session_id=data.validated_data.get("session_id"))
        return Response({"jobs": _jobs_out(jobs)}, status=status.HTTP_202_ACCEPTED)


@extend_schema_view(post=extend_schema(summary="Ingest a memory base's pending outputs now"))
class MemoryBaseFlushView(MemoryBaseJobsView):
    service = staticmethod(memory_base_flush)


@extend_schema_view(post=extend_schema(summary="Clear and rebuild a memory base"))
class MemoryBaseRegenerateView(MemoryBaseJobsView):
    service = staticmethod(memory_base_regenerate)


def _jobs_out(jobs: list[MemoryBaseJob]) -> Any:
    """The jobs as they are now (a queued job may have run or failed to queue); if the
    database went away after they committed, as the service returned them."""

    def fresh() -> list[MemoryBaseJob]:
        qs = MemoryBaseJob.objects.select_related("session").filter(pk__in=[j.pk for j in jobs])
        by_id = {job.pk: job for job in qs}
        return [by_id[j.pk] for j in jobs]

    return JobOutputSerializer(read_after_commit(fresh, lambda: jobs), many=True).data


class JobDetailView(APIView):
    """Any job of the caller: a Memory Base sync or a knowledge-base batch."""

    @extend_schema(
        summary="Get a job (any kind)",
        responses=PolymorphicProxySerializer(
            component_name="AnyJob",
            serializers=[JobOutputSerializer, IngestJobAnswerSerializer],
            resource_type_field_name=None,
        ),
    )
    def get(self, request: Request, job_id: Any) -> Response:
        try:
            job = job_get(owner=request.user, job_id=job_id)
        except MemoryBaseJob.DoesNotExist:
            return Response(job_answer(ingest_job_get_by_id(owner=request.user, job_id=job_id)))
        return Response(JobOutputSerializer(job).data)
