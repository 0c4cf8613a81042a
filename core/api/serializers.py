from collections.abc import Collection, Mapping
from typing import Any

from django.urls import reverse
from rest_framework import serializers

from core.api.fields import StrictCharField
from core.models import APIKey


class APIKeyOutputSerializer(serializers.ModelSerializer):
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = APIKey
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at", "is_active"]


class APIKeyCreateInputSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100, required=False, allow_blank=True, default="")


class APIKeyCreatedSerializer(APIKeyOutputSerializer):
    key = StrictCharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(APIKeyOutputSerializer.Meta):
        fields = [*APIKeyOutputSerializer.Meta.fields, "key"]


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = StrictCharField()


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
    for key, value in data.items():
        if key in fixed and str(value) != str(fixed[key]):
            errors[key] = why_fixed.format(key=key)
        elif key not in changeable and key not in fixed and key not in ignored:
            errors[key] = unknown.format(key=key)
    if errors:
        raise serializers.ValidationError(errors)
