"""Door 2, OpenAI function calling: ``GET /api/v1/tools`` lists the tools as OpenAI
``tools`` entries, ``POST /api/v1/tools/{name}/call`` runs one for the caller."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.schema import ERROR
from memories.tools.api.serializers import (
    ToolCallOutputSerializer,
    ToolCallSerializer,
    ToolListSerializer,
)
from memories.tools.registry import ToolContext, tool_call, tool_get, tools_offered
from memories.tools.scoping import request_values


class ToolListView(APIView):
    @extend_schema(summary="The agent tools, as OpenAI function definitions",
                   responses=ToolListSerializer)  # fmt: skip
    def get(self, request: Request) -> Response:
        return Response({"tools": [t.openai() for t in tools_offered()]})


class ToolCallView(APIView):
    reads = True  # each tool that writes is refused to a read-only key (tools.registry)
    tools_may_write = True  # so it reads from the primary (core.replicas)

    @extend_schema(summary="Call an agent tool", request=ToolCallSerializer,
                   responses={200: ToolCallOutputSerializer, 409: ERROR})  # fmt: skip
    def post(self, request: Request, name: str) -> Response:
        tool = tool_get(name)
        data = ToolCallSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        scope = data.validated_data.get("scope")
        values = request_values(request, data.validated_data["scope_values"])
        result = tool_call(
            owner=request.user, name=name, arguments=data.validated_data["arguments"],
            scope=scope, values=values,
        )  # fmt: skip
        filled = (
            list(ToolContext(owner=request.user, scope=scope, values=values).filled_scope())
            if tool.scoped and scope
            else None
        )
        return Response({"name": name, "scope": filled, "result": result})
