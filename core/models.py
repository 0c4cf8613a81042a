from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now
from django.utils import timezone


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
    # Narrowed when created (issue 30): a read-only key reads and searches, and writes
    # nothing; an expiring key stops working at ``expires_at``.
    read_only = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    # Narrowed to named resources (``core.key_limits``): null reaches every one of the
    # kind, a list only those (an empty list none); ``scope`` is a scope path the key's
    # memory scopes must start with (``["user", "<id>"]``: one end user).
    knowledge_bases = ArrayField(models.UUIDField(), null=True, blank=True)
    memory_bases = ArrayField(models.UUIDField(), null=True, blank=True)
    flows = ArrayField(models.UUIDField(), null=True, blank=True)
    memory_stores = ArrayField(models.UUIDField(), null=True, blank=True)
    scope = ArrayField(models.CharField(max_length=255), null=True, blank=True)
    tools = ArrayField(models.CharField(max_length=100), null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        indexes = [models.Index(fields=["owner", "-created_at"], name="apikey_owner_created")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(scope__isnull=True) | models.Q(scope__len__range=(1, 8)),
                name="apikey_scope_1_to_8_segments",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and (
            self.expires_at is None or self.expires_at > timezone.now()
        )


class MetricCounter(models.Model):
    """Monotonic counters shared by every process, exported at /metrics
    (``core.metrics``: each app declares its counters)."""

    name = models.CharField(max_length=100, primary_key=True)
    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


# The largest daily token budget an owner can set (the API and the admin).
MAX_DAILY_TOKENS = 10**15

USAGE_KINDS = (
    ("extraction", "Fact extraction"),
    ("dream", "Dreams"),
    ("summary", "Context summaries"),
    ("memory_base", "Memory Base outputs"),
    ("query_rewrite", "Query rewriting"),
    ("proxy", "Chat proxy (upstream answers)"),
    ("tool_loop", "Chat proxy tool loops"),
    ("embedding", "Embeddings (remote providers)"),
    ("other", "Other"),
)


class UsageDay(models.Model):
    """The tokens an owner's work spent on one day (UTC), per kind of work, model and end
    user (``subject``: a scope as ``user/alice``, "" for none): one row per key, raised
    by every call (``core.usage``), never one row per call."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_days"
    )
    day = models.DateField()
    kind = models.CharField(max_length=32, choices=USAGE_KINDS)
    model = models.CharField(max_length=200)
    subject = models.CharField(max_length=255, blank=True, default="")
    calls = models.BigIntegerField(default=0)
    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    # Calls whose provider sent no usage: their tokens were counted with the tokenizer.
    estimated_calls = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "usage (day)"
        verbose_name_plural = "usage (days)"
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "day", "kind", "model", "subject"], name="usageday_key"
            ),
            models.CheckConstraint(
                condition=models.Q(
                    calls__gte=0, tokens_in__gte=0, tokens_out__gte=0, estimated_calls__gte=0
                ),  # fmt: skip
                name="usageday_counts_not_negative",
            ),
        ]
        indexes = [models.Index(fields=["owner", "day"], name="usageday_owner_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.kind} {self.model}"


class UsageTotal(models.Model):
    """Every owner's usage since the start, per kind and model: what /metrics exports
    (labelled by kind and model, never by owner: bounded label cardinality)."""

    kind = models.CharField(max_length=32, choices=USAGE_KINDS)
    model = models.CharField(max_length=200)
    calls = models.BigIntegerField(default=0)
    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    estimated_calls = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "model"], name="usagetotal_key")]

    def __str__(self) -> str:
        return f"{self.kind} {self.model}"


class UsageBudget(models.Model):
    """An owner's daily token budget for background work (``core.usage``)."""

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
        related_name="usage_budget",
    )  # fmt: skip
    daily_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Tokens a day (UTC) this owner's background work (extraction, scheduled "
        "dreams) may spend; past it the work waits for the next day. Empty: the "
        "deployment's USAGE_DAILY_TOKEN_BUDGET.",
    )
    # The last time work was deferred for it, and how many runs were that day.
    deferred_at = models.DateTimeField(null=True, blank=True)
    deferred_runs = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"budget of {self.owner.username}"  # (the admin's messages name owners)


class AccessEvent(models.Model):
    """The audit trail of access (``core.audit``): a key created or revoked, an erasure;
    who acted, with which key, from which address, when. Never memory content."""

    class Action(models.TextChoices):
        KEY_CREATED = "key_created"
        KEY_NARROWED = "key_narrowed"
        KEY_REVOKED = "key_revoked"
        ERASURE = "erasure"

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=32, choices=Action.choices)
    actor = models.CharField(max_length=200, help_text="key:PREFIX, admin:USERNAME, ...")
    key = models.ForeignKey(
        APIKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="the key that acted",
    )  # fmt: skip
    subject_key = models.ForeignKey(
        APIKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="the key created or revoked",
    )  # fmt: skip
    address = models.GenericIPAddressField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "-at"], name="accessevent_owner_time")]

    def __str__(self) -> str:
        return f"{self.action} by {self.actor} at {self.at:%Y-%m-%d %H:%M}"


class WritePosition(models.Model):
    """Where the primary's WAL stood after an owner's last write (``core.replicas``): the
    owner reads from a replica only once it has replayed this far (read-your-writes).
    Written only when read replicas are configured."""

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="+",
    )  # fmt: skip
    lsn = models.BigIntegerField(help_text="pg_current_wal_insert_lsn() - '0/0', in bytes")
    recorded_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"write position of {self.owner_id}"


class WorkerCluster(models.Model):
    """A running worker cluster, as every host sees it (``core.worker_claims``): its
    supervisor moves ``beat_at`` (the database's clock) every few seconds; a cluster whose
    beat is older than ``CLUSTER_DEAD_SECONDS`` is dead, and any host's supervisor hands
    the broker rows it had claimed back to the queue. No owner's data."""

    name = models.CharField(max_length=200, primary_key=True)
    host = models.CharField(max_length=255)
    started_at = models.DateTimeField(db_default=Now())
    beat_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["beat_at"], name="core_workercluster_beat")]

    def __str__(self) -> str:
        return self.name


class WorkerClaim(models.Model):
    """A broker row (``django_q_ormq``) a cluster claimed, with the ``lock`` value its
    claim set: written with the claim, deleted on acknowledgement. The row goes back to
    the queue early only while its lock still holds that value."""

    cluster = models.ForeignKey(WorkerCluster, on_delete=models.CASCADE, related_name="claims")
    task_id = models.BigIntegerField(help_text="django_q_ormq.id")
    lock = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "task_id"], name="one_claim_per_task"),
            models.CheckConstraint(condition=models.Q(task_id__gt=0), name="claim_task_id"),
        ]
        indexes = [models.Index(fields=["task_id"], name="core_workerclaim_task")]

    def __str__(self) -> str:
        return f"{self.cluster_id} claimed {self.task_id}"
