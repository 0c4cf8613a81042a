"""``POST /api/v1/users/{user_id}/memories``: the direct memory API's add, on the engine's
paths. ``infer: false`` stores the texts as given (``fact_add``, in the facts room's
view); ``infer: true`` records the messages as a flush of the scope
``["user", <id>]`` and runs the scope's debounced update at once (``updates_now``),
answering with the decisions as this endpoint always has."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from ingestion.updates import UpdateRun, updates_now
from memories.engine.api.background import PendingUpdateOutputSerializer
from memories.facts.api import views as facts_views
from memories.facts.api.serializers import (
    InferredDecisionSerializer,
    MemoryAddResultSerializer,
    MemoryAddSerializer,
)
from memories.facts.scopes import user_scope

# The direct API takes OpenAI's roles; a flush takes these.
ROLE_OF = {"developer": "system", "function": "tool"}


class InferOutputSerializer(serializers.Serializer):
    """Schema only: what the extraction decided, and the flush it ran as."""

    decisions = InferredDecisionSerializer(many=True)
    update = PendingUpdateOutputSerializer()  # type: ignore[assignment]  # the field is named update


def _messages(values: dict[str, Any]) -> list[dict[str, str]]:
    if values.get("content"):
        return [{"role": "user", "content": values["content"]}]
    return [
        {"role": ROLE_OF.get(m["role"], m["role"]), "content": m["content"]}
        for m in values["messages"]
    ]


def _decisions(run: UpdateRun) -> list[dict[str, Any]]:
    out = [
        {"content": d.content, "action": d.action, "reason": d.reason, "fact_id": d.fact_id,
         "target_id": d.target_id}
        for d in run.decisions
    ]  # fmt: skip
    out += [
        {"content": run.removed_content.get(fact_id, ""), "action": "delete",
         "reason": "no longer true", "fact_id": None, "target_id": fact_id}
        for fact_id in run.removed
    ]  # fmt: skip
    # (and the older names, which clients read: fact for content, memory_id for fact_id)
    return [{**d, "fact": d["content"], "memory_id": d["fact_id"]} for d in out]


class UserMemoriesView(facts_views.UserMemoriesView):
    @extend_schema(
        summary="Add memories (extracted by the LLM, or stored as given)",
        request=MemoryAddSerializer,
        responses={
            201: MemoryAddResultSerializer,
            200: PolymorphicProxySerializer(
                component_name="MemoryAddOutcome",
                serializers=[MemoryAddResultSerializer, InferOutputSerializer],
                resource_type_field_name=None,
            ),
        },
        description="infer=false: 201 with the stored memories (200 when all were "
        "duplicates), and the ids evicted by ENGINE_MAX_FACTS. infer=true: the messages "
        "go through the scope's debounced updates with a window of zero (one extraction, "
        "this flush and any pending one of the user's scope): 200 with the decisions and "
        'the flush (status done, its note saying what was learned or "nothing to learn"; '
        "malformed, with the reason and the answer's start, when the LLM's answer could not "
        "be read even asked again; pending, with its error, when the LLM failed or another "
        "run of the scope held it past 30 s: the sweep runs it).",
    )
    def post(self, request: Request, user_id: str) -> Response:
        external_id = facts_views._user_id(user_id)
        data = MemoryAddSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if not values["infer"]:
            return self.add_as_given(request, external_id, values)
        update, run = updates_now(
            owner=request.user.pk, scope=user_scope(external_id), messages=_messages(values),
            source="api",
        )  # fmt: skip
        return Response(
            {"decisions": _decisions(run), "update": PendingUpdateOutputSerializer(update).data},
            status=status.HTTP_200_OK,
        )
