from __future__ import annotations

from django.conf import settings
from django.db import models


class APIKey(models.Model):
    """A bearer credential for the API. Only a SHA-256 digest of the key is stored.

    The key is high-entropy random, so a fast unsalted digest is enough (as for
    GitHub tokens): nothing to brute-force, and lookup stays one indexed query.
    """

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise a key.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        indexes = [models.Index(fields=["owner", "-created_at"], name="apikey_owner_created")]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class MetricCounter(models.Model):
    """Monotonic counters shared by every process, exported at /metrics
    (``core.metrics``: each app declares its counters)."""

    name = models.CharField(max_length=100, primary_key=True)
    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"
