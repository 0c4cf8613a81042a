import uuid
from collections.abc import Collection, Mapping
from datetime import timedelta
from typing import Any

from django.http import QueryDict
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from core.api.fields import (
    QUERY_BOOLEAN,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    query_boolean,
)
from core.errors import InvalidInput
from core.key_limits import key_limits_payload
from core.models import MAX_DAILY_TOKENS, USAGE_KINDS, APIKey
from core.selectors import USAGE_GROUPS

LIMIT_IDS = "Only these ids (an empty list: none); null: every one."


def refuse_unknown(data: Any, fields: Collection[str]) -> None:
    """A body's keys that name no field of it, each named in one 400: a typo
    (``session`` for ``session_id``) would otherwise ask for the request's widest form
    (a flush of every session, a regeneration of the whole base)."""
    if isinstance(data, Mapping):
        unknown = sorted(str(key) for key in set(data) - set(fields))
        if unknown:
            raise serializers.ValidationError({key: [f"Unknown field {key}."] for key in unknown})


# An OpenAI message's keys beside role and content, which a message of a run (or of a
# user's memories) takes and drops: an agent's message list is sent as it is.
# The keys of OpenAI's messages (an SDK's ``model_dump()`` of a reply included: its
# ``annotations``, ``audio``, ``function_call``; DeepSeek's and OpenRouter's reasoning)
# that a message list sent as an agent keeps it may carry: taken and not used.
OPENAI_MESSAGE_KEYS = frozenset({
    "name", "tool_call_id", "tool_calls", "refusal", "annotations", "audio", "function_call",
    "reasoning_content", "reasoning",
})  # fmt: skip


class RefusingUnknown(serializers.Serializer):
    """A body (or an item of one) whose keys that name no field are a 400 naming each
    (``refuse_unknown``): ``"topk": 1`` searched with the default, ``"chunksize": 300``
    made a base of 1,000-character chunks, a misspelt ``infer`` ran an extraction."""

    # Keys a well-known client sends that the body has no use for: taken and dropped.
    passed_over: frozenset[str] = frozenset()

    def to_internal_value(self, data: Any) -> Any:
        refuse_unknown(data, {*self.fields, *self.passed_over})
        return super().to_internal_value(data)


class KeyLimitsSerializer(serializers.Serializer):
    """What a key is narrowed to (``core.key_limits``); null: not narrowed on that."""

    knowledge_bases = serializers.ListField(child=serializers.UUIDField(), allow_null=True,
                                            help_text=LIMIT_IDS)  # fmt: skip
    memory_bases = serializers.ListField(child=serializers.UUIDField(), allow_null=True,
                                         help_text=LIMIT_IDS)  # fmt: skip
    flows = serializers.ListField(child=serializers.UUIDField(), allow_null=True,
                                  help_text=LIMIT_IDS)  # fmt: skip
    memory_stores = serializers.ListField(child=serializers.UUIDField(), allow_null=True,
                                          help_text=LIMIT_IDS)  # fmt: skip
    scope = serializers.ListField(
        child=StrictCharField(), allow_null=True, min_length=1, max_length=8,
        help_text='The memory scopes the key reaches start with this path (["user", "<id>"]: '
        "one end user, also the users/{id} routes and the chat proxy's user header).",
    )  # fmt: skip
    tools = serializers.ListField(
        child=StrictCharField(), allow_null=True,
        help_text="The agent tools the key may list and call (REST, MCP, the chat proxy).",
    )  # fmt: skip


@extend_schema_field(KeyLimitsSerializer(allow_null=True))
class KeyLimitsInputField(serializers.JSONField):
    """The limits as sent; ``core.services.api_key_create`` checks them (each bad name or
    value a 400 naming ``limits.<name>``)."""


class APIKeyOutputSerializer(serializers.ModelSerializer):
    is_active = serializers.BooleanField(read_only=True)
    limits = serializers.SerializerMethodField()

    class Meta:
        model = APIKey
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at", "read_only",
                  "expires_at", "limits", "is_active"]  # fmt: skip

    @extend_schema_field(KeyLimitsSerializer)
    def get_limits(self, key: APIKey) -> dict[str, Any]:
        return key_limits_payload(key)


class APIKeyCreateInputSerializer(RefusingUnknown):
    name = StrictCharField(max_length=100, required=False, allow_blank=True, default="")
    # (a field named as Field's own attribute: DRF moves declared fields off the class)
    read_only = StrictBooleanField(  # type: ignore[assignment]
        required=False, default=False,
        help_text="The key reads and searches, and changes nothing (a 403 read_only_key).",
    )  # fmt: skip
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True, default=None,
        help_text="When the key stops working (in the future); null: never.",
    )  # fmt: skip
    limits = KeyLimitsInputField(
        required=False, default=None,
        help_text="Narrow the key to named knowledge bases, memory bases, flows, memory "
        "stores, a scope and tools; outside them it gets a 403 key_limit. Leave a name out "
        "(or null) not to narrow on it.",
    )  # fmt: skip


class APIKeyCreatedSerializer(APIKeyOutputSerializer):
    key = StrictCharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(APIKeyOutputSerializer.Meta):
        fields = [*APIKeyOutputSerializer.Meta.fields, "key"]


BUDGET_HELP = (
    "Tokens a day (UTC) your background work (extraction, scheduled dreams) may spend; past "
    "it the work waits for the next day, nothing is dropped. null: the deployment's default "
    "(USAGE_DAILY_TOKEN_BUDGET)."
)


class MeKeySerializer(serializers.Serializer):
    id = StrictIntegerField()
    prefix = StrictCharField()
    read_only = serializers.BooleanField()  # type: ignore[assignment]
    expires_at = serializers.DateTimeField(allow_null=True)
    limits = KeyLimitsSerializer()


class MeSerializer(serializers.Serializer):
    id = StrictIntegerField()
    username = StrictCharField()
    background_daily_tokens = StrictIntegerField(allow_null=True, help_text=BUDGET_HELP)
    key = MeKeySerializer(
        allow_null=True,
        help_text="The API key of this request and its limits (null for an admin session).",
    )


class MeUpdateSerializer(RefusingUnknown):
    background_daily_tokens = StrictIntegerField(
        min_value=0, max_value=MAX_DAILY_TOKENS, allow_null=True, help_text=BUDGET_HELP
    )


class UsageBudgetSerializer(serializers.Serializer):
    daily_tokens = StrictIntegerField(
        allow_null=True, help_text="In force today (yours, or the default); null: no cap."
    )
    spent_today = StrictIntegerField(help_text="Tokens of extraction and dreams today.")
    resets_at = serializers.DateTimeField()
    deferred_runs_today = StrictIntegerField()
    last_deferred_at = serializers.DateTimeField(allow_null=True)


USAGE_MAX_DAYS = 366


class UsageQuerySerializer(serializers.Serializer):
    """``GET /api/v1/usage``'s query (``from`` and ``to`` arrive as ``start`` and ``end``:
    ``from`` is a Python keyword)."""

    start = serializers.DateField(required=False)
    end = serializers.DateField(required=False)
    group_by = StrictCharField(required=False, default="day,kind")

    def validate_group_by(self, value: str) -> list[str]:
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = sorted(set(names) - set(USAGE_GROUPS))
        if unknown or not names or len(set(names)) != len(names):
            raise serializers.ValidationError(
                f"group_by: a comma-separated list of {', '.join(USAGE_GROUPS)}, each once"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        return names

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        end = attrs.get("end") or timezone.now().date()
        start = attrs.get("start") or end - timedelta(days=29)
        if start > end:
            raise serializers.ValidationError({"from": ["must not be after to"]})
        if (end - start).days >= USAGE_MAX_DAYS:
            raise serializers.ValidationError({"from": [f"at most {USAGE_MAX_DAYS} days"]})
        return {**attrs, "start": start, "end": end}


class UsageSumsSerializer(serializers.Serializer):
    calls = StrictIntegerField()
    tokens_in = StrictIntegerField()
    tokens_out = StrictIntegerField()
    estimated_calls = StrictIntegerField(
        help_text="Calls whose provider sent no usage: counted with the tokenizer."
    )


class UsageRowSerializer(UsageSumsSerializer):
    day = serializers.DateField(required=False, help_text="With group_by day.")
    kind = serializers.ChoiceField(
        choices=[k for k, _ in USAGE_KINDS], required=False, help_text="With group_by kind."
    )
    model = StrictCharField(required=False, help_text="With group_by model.")
    subject = StrictCharField(
        required=False, help_text="With group_by subject: the end user or scope, '' for none."
    )


# The answer of GET /api/v1/usage ("from" and "to" are no Python names: an inline one).
UsageSerializer = inline_serializer(
    "Usage",
    fields={
        "from": serializers.DateField(),
        "to": serializers.DateField(),
        "group_by": serializers.ListField(child=StrictCharField()),
        "totals": UsageSumsSerializer(),
        "results": UsageRowSerializer(many=True),
        "budget": UsageBudgetSerializer(),
    },
)


JOB_FIELDS = [
    "id",
    "kind",
    "url",
    "status",
    "attempts",
    "error",
    "created_at",
    "started_at",
    "finished_at",
]


class JobOutputBase(serializers.ModelSerializer):
    """The one job shape: these fields for every kind of job, then the kind's own
    (``Meta.fields`` = ``JOB_FIELDS`` + them). ``url`` is where to poll it:
    ``GET /api/v1/jobs/{id}`` answers every kind."""

    KIND = ""
    kind = serializers.SerializerMethodField(help_text="What the job does.")
    url = serializers.SerializerMethodField(help_text="GET it to poll the job.")

    def get_kind(self, job: Any) -> str:
        return self.KIND

    def get_url(self, job: Any) -> str:
        return reverse("job-detail", kwargs={"job_id": job.pk})


def query_flag(params: Mapping[str, Any], name: str, *, default: bool) -> bool:
    """A query parameter's boolean, as the docs say they are written: ``true``/``false``/
    ``1``/``0`` (the words ``StrictBooleanField`` takes). Another word (``yes``, a typo)
    is a 400 naming it, not the default."""
    raw = params.get(name)
    if raw is None:
        return default
    read = query_boolean(str(raw))
    if read is None:
        raise InvalidInput.at(name, QUERY_BOOLEAN)
    return read


def refuse_changes(
    data: Mapping[str, Any],
    *,
    changeable: Collection[str],
    fixed: Mapping[str, Any],
    ignored: Collection[str],
    why_fixed: str,
    unknown: str,
) -> None:
    """A PATCH body's checks beyond its fields: a field in ``fixed`` whose value differs
    from the object's (``why_fixed``), and a field that is neither ``changeable``,
    ``fixed`` nor ``ignored`` (the answer's computed fields: ``unknown``), each named in
    one 400. A GET body sent back unchanged passes."""
    errors = {}
    text = isinstance(data, QueryDict)  # (a form's values are all text: compared as text)
    for key, value in data.items():
        if key in fixed and not text and (wrong := _wrong_type(value, fixed[key])):
            errors[key] = wrong
        elif key in fixed and not _same(value, fixed[key]):
            errors[key] = why_fixed.format(key=key)
        elif key not in changeable and key not in fixed and key not in ignored:
            errors[key] = unknown.format(key=key)
    if errors:
        raise serializers.ValidationError(errors)


def _wrong_type(given: Any, kept: Any) -> str | None:
    """What is wrong with a fixed field's value of another JSON type than the object's
    own (``"1000"`` or ``1000.0`` for a ``chunk_size`` of 1000), None when it is of it:
    the strict fields' type error, as a changeable field's, not "cannot be changed"."""
    if isinstance(kept, bool):
        return None if isinstance(given, bool) else "Must be a boolean (true or false)."
    if isinstance(kept, int):
        return None if type(given) is int else "Must be a whole number."
    if kept is None or isinstance(given, str):
        return None
    return "Must be a string."


def _same(given: Any, kept: Any) -> bool:
    """Whether a value sent back is the object's own: as text, or as the same UUID in any
    case or form (Swift's ``uuidString`` is upper case)."""
    if str(given) == str(kept):
        return True
    try:
        return uuid.UUID(str(given)) == uuid.UUID(str(kept))
    except ValueError:
        return False
