"""``GET /api/v1/export`` and ``POST /api/v1/import``: the caller's memory as JSON Lines
(``ingestion.portability``)."""

from __future__ import annotations

import json
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.fields import StrictIntegerField
from core.api.schema import ERROR
from core.api.serializers import query_flag
from core.errors import InvalidInput
from ingestion.portability import export_lines, import_lines


class ImportReportSerializer(serializers.Serializer):
    """Schema only: what an import wrote (new rows and files per kind: a second import
    of the same file writes none), the texts it embedded again and the lines it read."""

    flows = StrictIntegerField()
    messages = StrictIntegerField()
    summaries = StrictIntegerField()
    node_memories = StrictIntegerField()
    knowledge_bases = StrictIntegerField()
    memory_bases = StrictIntegerField()
    stores = StrictIntegerField()
    store_items = StrictIntegerField()
    attachments = StrictIntegerField()
    chunks = StrictIntegerField()
    scopes = StrictIntegerField()
    facts = StrictIntegerField()
    versions = StrictIntegerField()
    files = StrictIntegerField()
    embedded = StrictIntegerField()
    lines = StrictIntegerField()


class ExportView(APIView):
    owner_wide = ("GET",)  # not to a narrowed key (core.key_limits)

    @extend_schema(
        summary="Export the caller's memory",
        parameters=[
            OpenApiParameter(
                "vectors",
                bool,
                description="Include the vectors (true, the default, or 1; false or 0).",
            )
        ],
        responses={(200, "application/x-ndjson"): OpenApiTypes.STR},
        description="JSON Lines, streamed: a header, then the caller's knowledge bases, "
        "conversations, memory bases, memory stores, facts with every earlier version and "
        "journals (docs/history-and-export.md).",
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        vectors = query_flag(request.query_params, "vectors", default=True)
        lines = (line + "\n" for line in export_lines(owner=request.user, vectors=vectors))
        response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
        response["Content-Disposition"] = 'attachment; filename="memory-export.jsonl"'
        return response


class ImportView(APIView):
    owner_wide = ("POST",)  # not to a narrowed key (core.key_limits)
    parser_classes: list[Any] = []  # the body is read as it is (JSON Lines)

    @extend_schema(
        summary="Import an export into the caller's memory",
        request={"application/x-ndjson": OpenApiTypes.STR},
        parameters=[
            OpenApiParameter(
                "scope_map",
                str,
                description='A JSON object renaming scopes, e.g. {"user/alice": "user/ann"}.',
            )
        ],  # fmt: skip
        responses={200: ImportReportSerializer, 400: ERROR},
        description="Idempotent (the same file twice writes nothing new) and all or nothing "
        "(a bad line is a 400 invalid_import naming it; nothing is written).",
    )
    def post(self, request: Request) -> Response:
        raw_map = request.query_params.get("scope_map")
        try:
            scope_map = json.loads(raw_map) if raw_map else {}
        except ValueError:
            scope_map = None
        if not isinstance(scope_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in scope_map.items()
        ):
            raise InvalidInput("scope_map is not a JSON object of strings",
                               details={"scope_map": raw_map})  # fmt: skip
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(
                "the body is not UTF-8 text", details={"body": "not UTF-8"}
            ) from None
        report = import_lines(owner=request.user, lines=text.splitlines(), scope_map=scope_map)
        return Response(report.as_dict())
