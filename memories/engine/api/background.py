"""The engine's background tiers over REST: debounced flushes, the journal, Deep Dream
(with undo and the per-owner schedule switch) and context summaries.

Thin views: input serializer -> service -> output serializer. Errors are the services'
(``core.errors`` family), mapped once by the API's exception handler.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, cast
from uuid import UUID

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.fields import StrictBooleanField, StrictCharField, StrictIntegerField
from core.api.pagination import paginated_response
from core.api.schema import ERROR, paginated
from core.api.serializers import (
    OPENAI_MESSAGE_KEYS,
    RefusingUnknown,
    query_flag,
    refuse_unknown,
)
from core.errors import InvalidInput
from memories.conversations.history import effective_message_limit
from memories.conversations.selectors import flow_get
from memories.conversations.summaries import (
    SummaryMessage,
    conversation_key,
    conversation_thread,
    scope_conversation_key,
    session_still_there,
    summary_fold,
)
from memories.engine import files
from memories.engine.api.serializers import ScopedSerializer
from memories.engine.api.views import SCOPE_PARAMETER, _engine, _query_scope, _validated
from memories.engine.dreams import (
    ScopeNotFound,
    dream_get,
    dream_list,
    dream_undo,
)
from memories.engine.models import Dream, PendingUpdate
from memories.engine.owner_settings import engine_settings_get, engine_settings_update
from memories.engine.updates import MESSAGE_ID_CHARS, ROLES, pending_of, update_list
from memories.facts.models import Scope
from memories.facts.scopes import ScopePath, scope_find
from memories.facts.services import scope_hold


# --- input --------------------------------------------------------------------------
def _owner(request: Request) -> int:
    return int(cast(Any, request.user).pk)


def scope_row(request: Request) -> Scope:
    """The caller's scope named by the query string (``?scope=user&scope=alice`` or a
    JSON list, templates filled from the other parameters); 404 if it has none."""
    engine = _engine(request, dict(request.query_params.items()))
    scope = _query_scope(request, engine, required=True)
    row = scope_find(owner=_owner(request), scope=cast(ScopePath, scope))
    if row is None:
        raise ScopeNotFound("no such scope")
    return row


class FlushInSerializer(ScopedSerializer):
    # (each message an object here: validate_messages reads them, its errors naming
    # each field by its path, messages[0].role)
    messages = serializers.ListField(child=serializers.DictField(), allow_empty=False)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": MESSAGE_ID_CHARS,
             "pattern": "^[^,]+$"},
            {"type": "integer"},
        ],
        "description": "Your id of the message (no comma), the source of the facts "
        "learned from it.",
    }
)  # fmt: skip
class FlushMessageIdField(serializers.Field):
    """(Schema only: ``validate_messages`` reads the id.)"""


@extend_schema_serializer(component_name="EngineFlushMessage")
class FlushMessageSchema(serializers.Serializer):
    """A flush's message (schema only: ``validate_messages`` reads it). Beside these keys
    an OpenAI message's ``name``, ``tool_call_id``, ``tool_calls`` and ``refusal`` are
    taken and dropped; any other is a 400 naming it."""

    role = serializers.ChoiceField(choices=ROLES)
    content = StrictCharField(max_length=settings.MESSAGE_MAX_CHARS)
    at = StrictCharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="When it was said, ISO 8601 (without a zone, UTC; an offset is converted).",
    )
    id = FlushMessageIdField(required=False)


@extend_schema_serializer(component_name="EngineFlushIn")
class FlushInSchema(FlushInSerializer):
    # (the flush's body as the schema shows it; FlushInSerializer takes it)
    messages = serializers.ListField(
        child=FlushMessageSchema(), min_length=1, max_length=settings.RUN_MAX_MESSAGES
    )


class DreamInSerializer(ScopedSerializer):
    lookback_days = StrictIntegerField(min_value=1, max_value=90, required=False)


@extend_schema_serializer(component_name="EngineSettingsIn")
class SettingsInSerializer(serializers.Serializer):
    dream_schedule = StrictBooleanField(
        required=False, help_text="The daily dream of the owner's scopes (default true)."
    )
    memory_tools = StrictBooleanField(
        required=False,
        help_text="The chat proxy's memory tools for every chat of the owner's end users "
        "that does not say (default false; per request: memory_tools).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_unknown(self.initial_data, self.fields)
        if not attrs:
            raise serializers.ValidationError("Give dream_schedule or memory_tools.")
        return attrs


@extend_schema_serializer(component_name="EngineSettings")
class SettingsOutSerializer(serializers.Serializer):
    dream_schedule = serializers.BooleanField()
    memory_tools = serializers.BooleanField()


class SummaryMessageSerializer(RefusingUnknown):
    passed_over = OPENAI_MESSAGE_KEYS  # an agent's message list is sent as it is

    # (required, and unique in a call: the running summary remembers messages by id; an
    # id left out was its place in the list, so the next call's new messages were taken
    # for the folded ones and lost)
    id = StrictCharField(max_length=255)
    role = serializers.ChoiceField(choices=("user", "assistant", "system", "tool"))
    content = StrictCharField(allow_blank=True, trim_whitespace=False, max_length=100_000)


class ConversationRefSerializer(RefusingUnknown):
    flow = serializers.UUIDField()
    session_id = StrictCharField(max_length=255)
    message_limit = StrictIntegerField(min_value=1, max_value=10_000, default=500)


class SummaryInSerializer(ScopedSerializer):
    conversation = ConversationRefSerializer(required=False)
    conversation_id = StrictCharField(max_length=255, required=False)
    messages = SummaryMessageSerializer(many=True, required=False)
    max_tokens = StrictIntegerField(min_value=16, max_value=1_000_000)
    max_tokens_before_summary = StrictIntegerField(min_value=16, required=False)
    max_summary_tokens = StrictIntegerField(min_value=1, default=256)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("conversation" in attrs) == ("messages" in attrs):
            raise serializers.ValidationError(
                {"conversation": "send either a stored conversation or messages (one of them)"}
            )
        counted = Counter(m["id"] for m in attrs.get("messages") or ())
        repeated = sorted(i for i, n in counted.items() if n > 1)
        if repeated:
            raise serializers.ValidationError(
                {"messages": [f"message ids must differ: {', '.join(map(repr, repeated))} repeat"]}
            )
        if "messages" in attrs and not attrs.get("conversation_id"):
            raise serializers.ValidationError(
                {
                    "conversation_id": "messages need a conversation_id: the running summary is kept per conversation"
                }
            )
        return attrs


# --- output -------------------------------------------------------------------------
class PendingUpdateOutputSerializer(serializers.ModelSerializer):
    scope = serializers.SerializerMethodField()

    class Meta:
        model = PendingUpdate
        fields = ["id", "scope", "status", "source", "due_at", "attempts", "error", "note",
                  "answer_excerpt", "batch_id", "created_at", "processed_at"]  # fmt: skip

    def get_scope(self, update: PendingUpdate) -> list[str]:
        return list(update.scope.path)


class DreamOutputSerializer(serializers.ModelSerializer):
    scope = serializers.SerializerMethodField()

    class Meta:
        model = Dream
        fields = ["id", "scope", "status", "trigger", "lookback_days", "journal_days", "input_hash",
                  "changes", "diary", "memory_md_before", "memory_md_after", "llm_calls",
                  "created_at", "undone_at"]  # fmt: skip

    def get_scope(self, dream: Dream) -> list[str]:
        return list(dream.scope.path)


class DreamListSerializer(DreamOutputSerializer):
    class Meta(DreamOutputSerializer.Meta):
        fields = ["id", "scope", "status", "trigger", "lookback_days", "journal_days", "llm_calls",
                  "created_at", "undone_at"]  # fmt: skip


# --- views --------------------------------------------------------------------------
class FlushView(APIView):
    @extend_schema(
        summary="Record messages for the scope's next extraction",
        request=FlushInSchema,
        responses={202: PendingUpdateOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        """Record messages of a scope for its next (debounced) extraction; answers at once."""
        data = _validated(FlushInSerializer, request.data)
        update = _engine(request, data["scope_values"]).flush(
            data["scope"], data["messages"], source="api"
        )
        body = dict(PendingUpdateOutputSerializer(update).data)
        body["pending_in_scope"] = pending_of(update.scope_id).count()
        return Response(body, status=status.HTTP_202_ACCEPTED)


class UpdatesView(APIView):
    @extend_schema(
        summary="A scope's flushes",
        parameters=[SCOPE_PARAMETER],
        responses={200: paginated(PendingUpdateOutputSerializer), 404: ERROR},
    )
    def get(self, request: Request) -> Response:
        """The scope's flushes, newest first: pending, done (with their batch and what it
        learned, ``note``), malformed (the LLM's answer could not be read: ``error`` says
        why, ``answer_excerpt`` shows its first 500 characters) or failed."""
        row = scope_row(request)
        qs = update_list(owner=_owner(request), scope=row).select_related("scope")
        return paginated_response(self, request, qs, PendingUpdateOutputSerializer)


class JournalView(APIView):
    @extend_schema(
        summary="A scope's journal (a day, or the days there are)",
        parameters=[
            SCOPE_PARAMETER,
            OpenApiParameter("date", OpenApiTypes.DATE, description="YYYY-MM-DD"),
            OpenApiParameter("download", bool, description="The .md file (true/false/1/0)"),
        ],
        responses={
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "text/markdown"): OpenApiTypes.STR,
            404: ERROR,
        },
    )
    def get(self, request: Request) -> Response | HttpResponse:
        """``?scope=...&date=YYYY-MM-DD``: that day's journal (``download=1``: the Markdown
        file); without a date: the days the scope has a journal for."""
        row = scope_row(request)
        if "date" not in request.query_params:
            if query_flag(request.query_params, "download", default=False):
                # (the list of days came back, as if the file were a JSON list)
                raise InvalidInput.at("date", "a download is of one day's journal: give its date")
            days = files.journal_days(owner_id=row.owner_id, scope=row.path)
            return Response({"scope": row.path, "days": [d.isoformat() for d in days]})
        day = files.parse_day(request.query_params["date"])
        text = files.journal_read(owner_id=row.owner_id, scope=row.path, day=day)
        if query_flag(request.query_params, "download", default=False):
            return markdown_download(text, f"journal-{'-'.join(row.path)}-{day.isoformat()}.md")
        return Response({"scope": row.path, "date": day.isoformat(), "markdown": text})


def markdown_download(text: str, filename: str) -> HttpResponse:
    response = HttpResponse(text, content_type="text/markdown; charset=utf-8")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in filename)
    response["Content-Disposition"] = f'attachment; filename="{safe}"'
    return response


class DreamView(APIView):
    @extend_schema(
        summary="Dream the scope now",
        request=DreamInSerializer,
        # 422: a dream that would drop more than ENGINE_DREAM_MAX_DROP (dream_too_lossy)
        responses={
            201: DreamOutputSerializer,
            200: DreamOutputSerializer,
            409: ERROR,
            422: ERROR,
        },  # fmt: skip
    )
    def post(self, request: Request) -> Response:
        """Dream the scope now: 201 with the dream, or 200 with the last one and
        ``skipped`` when its inputs have not changed (no LLM call)."""
        data = _validated(DreamInSerializer, request.data)
        engine = _engine(request, data["scope_values"])
        outcome = engine.dream(data["scope"], data.get("lookback_days"))
        body = dict(DreamOutputSerializer(outcome.dream).data)
        body["skipped"] = outcome.skipped
        return Response(
            body, status=status.HTTP_200_OK if outcome.skipped else status.HTTP_201_CREATED
        )


class DreamListView(APIView):
    @extend_schema(
        summary="A scope's dreams",
        parameters=[SCOPE_PARAMETER],
        responses={200: paginated(DreamListSerializer), 404: ERROR},
    )
    def get(self, request: Request) -> Response:
        row = scope_row(request)
        qs = dream_list(owner=_owner(request), scope=row).select_related("scope")
        return paginated_response(self, request, qs, DreamListSerializer)


class DreamDetailView(APIView):
    @extend_schema(summary="Get a dream", responses=DreamOutputSerializer)
    def get(self, request: Request, dream_id: UUID) -> Response:
        return Response(
            DreamOutputSerializer(dream_get(owner=_owner(request), dream_id=dream_id)).data
        )


class DreamUndoView(APIView):
    @extend_schema(
        summary="Undo a dream", request=None, responses={200: DreamOutputSerializer, 409: ERROR}
    )
    def post(self, request: Request, dream_id: UUID) -> Response:
        """Restore the facts and MEMORY.md as they were before the dream."""
        dream = dream_undo(owner=_owner(request), dream_id=dream_id)
        return Response(DreamOutputSerializer(dream).data)


class EngineSettingsView(APIView):
    owner_wide = ("GET", "PATCH")  # not to a narrowed key (core.key_limits)

    @extend_schema(summary="The engine settings of the owner", responses=SettingsOutSerializer)
    def get(self, request: Request) -> Response:
        row = engine_settings_get(owner=_owner(request))
        return Response(SettingsOutSerializer(row).data)

    @extend_schema(
        summary="Change the engine settings",
        request=SettingsInSerializer,
        responses=SettingsOutSerializer,
    )
    def patch(self, request: Request) -> Response:
        """``{"dream_schedule": false}`` turns the owner's daily dream off,
        ``{"memory_tools": true}`` its chats' memory tools on; a switch not sent keeps
        its value."""
        data = SettingsInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = engine_settings_update(owner=_owner(request), **data.validated_data)
        return Response(SettingsOutSerializer(row).data)


class SummariesView(APIView):
    @extend_schema(
        summary="Keep a conversation within a token budget",
        request=SummaryInSerializer,
        responses={200: OpenApiTypes.OBJECT, 422: ERROR},
    )
    def post(self, request: Request) -> Response:
        """Keep a conversation within ``max_tokens``: the newest messages verbatim, the
        older ones folded into its running summary (stored per conversation)."""
        values = _validated(SummaryInSerializer, request.data)
        values["scope"] = _engine(request, values["scope_values"]).scope(values["scope"])
        key, messages, with_store = _summary_input(request, values)
        result = summary_fold(
            owner=_owner(request), key=key, messages=messages, max_tokens=values["max_tokens"],
            max_tokens_before_summary=values.get("max_tokens_before_summary"),
            max_summary_tokens=values["max_summary_tokens"], with_store=with_store,
            thread="conversation" in values,  # a stored conversation's newest thread
        )  # fmt: skip
        return Response({
            "scope": list(values["scope"]),
            "messages": result.as_messages(),
            "token_count": result.token_count,
            "running_summary": {
                "text": result.summary,
                "summarized_message_ids": result.summarized_ids,
                "last_summarized_message_id": result.last_summarized_id,
            },
            "folded_now": result.folded,
            "llm_calls": result.llm_calls,
        })  # fmt: skip


def _summary_input(
    request: Request, values: dict[str, Any]
) -> tuple[str, list[SummaryMessage], Callable[[], Any]]:
    """The summary's key, its messages, and what runs in the transaction that stores
    it: a stored conversation's newest message held (a session deleted or erased while
    the LLM folded is a 409, its summary not stored, as the history's), a scope's
    summary its scope made (so erasing the scope finds the summary)."""
    if "conversation" in values:
        ref = values["conversation"]
        flow = flow_get(owner=cast(Any, request.user), flow_id=ref["flow"])
        items = conversation_thread(
            flow=flow,
            session_id=ref["session_id"],
            current_message_id=None,
            message_limit=effective_message_limit(ref["message_limit"]),
        )
        # Server ids, as the history's strategy=summarize remembers them (same summary).
        messages = [SummaryMessage(str(i.id), i.role, i.text_content()) for i in items]
        newest = items[-1].id if items else None
        return (
            conversation_key(flow, ref["session_id"]),
            messages,
            partial(session_still_there, flow, ref["session_id"], newest),
        )
    messages = [SummaryMessage(m["id"], m["role"], m["content"]) for m in values["messages"]]
    scope = values["scope"]
    return (
        scope_conversation_key(list(scope), values["conversation_id"]), messages,
        partial(scope_hold, owner=_owner(request), scope=scope),
    )  # fmt: skip
