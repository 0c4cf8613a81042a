from rest_framework import serializers

from core.models import APIKey


class APIKeyOutputSerializer(serializers.ModelSerializer):
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = APIKey
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at", "is_active"]


class APIKeyCreateInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class APIKeyCreatedSerializer(APIKeyOutputSerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(APIKeyOutputSerializer.Meta):
        fields = [*APIKeyOutputSerializer.Meta.fields, "key"]


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
