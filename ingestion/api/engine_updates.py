"""``POST /api/v1/engine/updates/run``: learn a scope's pending messages now and wait
(``ingestion.updates.updates_run_pending``); the flushes' own door is the engine's
``/api/v1/engine/flush``, which answers at once."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.fields import StrictCharField, StrictIntegerField
from core.api.schema import ERROR
from ingestion.updates import updates_run_pending
from memories.engine.api.serializers import DecisionSerializer, ScopedSerializer
from memories.engine.facade import MemoryEngine
from memories.facts.services import FactDecision


class UpdatesRunOutputSerializer(serializers.Serializer):
    """Schema only: the scope, how the run ended and what it decided."""

    scope = serializers.ListField(child=StrictCharField())
    status = serializers.ChoiceField(
        choices=["done", "empty", "busy", "failed", "gave_up", "malformed"],
        help_text="done; empty: nothing was pending; busy: another run held the scope past "
        "30 s (the flushes run on their schedule); failed: the LLM failed (retried later); "
        "malformed: its answer could not be read.",
    )
    note = StrictCharField(allow_blank=True)
    error = StrictCharField(
        allow_blank=True, help_text="Why a failed or malformed run did not learn (else empty)."
    )
    updates = StrictIntegerField(help_text="The flushes this run folded.")
    decisions = DecisionSerializer(
        many=True, help_text="One per fact: added, replaced, a duplicate...; a fact the "
        "messages made untrue is a delete, its id in target_id.",
    )  # fmt: skip


class UpdatesRunView(APIView):
    @extend_schema(
        summary="Learn a scope's pending messages now",
        request=ScopedSerializer,
        responses={200: UpdatesRunOutputSerializer, 404: ERROR, 503: ERROR},
        description="Runs the scope's pending flushes as if their debounce window had "
        "closed (one extraction) and answers when it is done: what a client that wants a "
        "fact learned before its next call does, instead of waiting for the window.",
    )
    def post(self, request: Request) -> Response:
        data = ScopedSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        engine = MemoryEngine(owner=request.user, values=data.validated_data["scope_values"])
        row = engine.existing(data.validated_data["scope"])
        run = updates_run_pending(scope=row)
        removed = [
            FactDecision(run.removed_content.get(fact_id, ""), "delete", "no longer true",
                         target_id=fact_id)
            for fact_id in run.removed
        ]  # fmt: skip
        body: dict[str, Any] = {
            "scope": list(row.path), "status": run.status, "note": run.note, "error": run.error,
            "updates": len(run.updates),
            "decisions": DecisionSerializer([*run.decisions, *removed], many=True).data,
        }  # fmt: skip
        return Response(body)
