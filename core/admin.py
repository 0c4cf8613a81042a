from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename, get_user_model
from django.contrib.auth.admin import UserAdmin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from core.admin_confirm import confirm_first
from core.errors import InvalidInput
from core.key_limits import LIMIT_NAMES, KeyLimits
from core.login_throttle import ThrottledAdminLoginForm
from core.models import MAX_DAILY_TOKENS, AccessEvent, APIKey, UsageBudget, UsageDay
from core.services import api_key_create, api_key_limits_clean, api_key_revoke
from core.usage import Budget, budget_of

IDS_HELP = "Comma-separated ids: the key reaches only these (empty: every one)."
KEY_FIELDS = ["owner", "name", "read_only", "expires_at", *LIMIT_NAMES]


class APIKeyAddForm(forms.ModelForm):
    class Meta:
        model = APIKey
        fields = KEY_FIELDS
        help_texts = {
            "read_only": "The key reads and searches, and changes nothing.",
            "expires_at": "When the key stops working (empty: never).",
            "knowledge_bases": IDS_HELP,
            "memory_bases": IDS_HELP,
            "flows": IDS_HELP,
            "memory_stores": IDS_HELP,
            "scope": "Comma-separated segments, e.g. user,alice: the key reaches only the "
            "memory scopes under it (one end user). Empty: every scope.",
            "tools": "Comma-separated tool names (e.g. search_memory): the only tools the key "
            "may list and call. Empty: every tool.",
        }

    def clean_expires_at(self):  # type: ignore[no-untyped-def]
        value = self.cleaned_data.get("expires_at")
        if value is not None and value <= timezone.now():
            raise forms.ValidationError("Choose a time in the future.")
        return value

    def clean(self):  # type: ignore[no-untyped-def]
        """The limits checked as the API checks them (the owner's ids, known tools)."""
        data = super().clean()
        for name in LIMIT_NAMES:  # an empty field: not narrowed (the model's null)
            if name in data and not data[name]:
                data[name] = None
        owner = data.get("owner")
        given = {n: [str(v) for v in data[n]] for n in LIMIT_NAMES if data.get(n)}
        if owner is None:
            return data
        try:
            for name, value in api_key_limits_clean(owner_id=owner.pk, limits=given).items():
                data[name] = value
        except InvalidInput as exc:
            for where, message in (exc.details or {}).items():
                self.add_error(where.removeprefix("limits.") or None, message)
        return data


def model_permission(model_admin: admin.ModelAdmin, request: HttpRequest, action: str) -> bool:
    """The user's own permission ``action`` (``change``, ``delete``) on the admin's model,
    for an action of an admin that refuses Django's own change or delete (its rows
    change only through the services its actions call)."""
    opts = model_admin.opts
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


class OwnerValidatedForm(forms.ModelForm):
    """A change form whose owner is read-only still checks the constraints that hold the
    owner (a name unique per owner): Django leaves out a field the form does not edit,
    and the database's IntegrityError was a 500."""

    def _get_validation_exclusions(self):  # type: ignore[no-untyped-def]
        exclude = super()._get_validation_exclusions()
        exclude.discard("owner")
        return exclude


class OwnerFixedAdmin(admin.ModelAdmin):
    """A row's owner is chosen when it is added and never changed: on a row keyed by its
    owner (a budget, engine settings) another owner would overwrite that owner's row, and
    a flow given to another owner leaves its memory bases and messages with the first."""

    form = OwnerValidatedForm

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        fields = list(super().get_readonly_fields(request, obj))
        return fields if obj is None or "owner" in fields else [*fields, "owner"]


class NoDjangoDeleteMixin:
    """Django's delete of these rows is not offered (no delete page, button or bulk
    action): it would skip what the service's own deletion does (an erasure's purge of
    chunks and files and its audit event, a key's revocation event). The permission
    itself stays, so deleting what holds them (a knowledge base and its chunks, through
    its service) is not refused for their sake."""

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)  # type: ignore[misc]
        actions.pop("delete_selected", None)
        return actions

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        raise PermissionDenied

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: Any = None) -> Any:  # fmt: skip
        extra = {**(extra_context or {}), "show_delete": False}
        return super().change_view(request, object_id, form_url, extra)  # type: ignore[misc]


class ScopePathSearchMixin:
    """The search box also finds a scope written as the lists show it (``user/alice``):
    the segments matched as one path, besides the admin's own fields."""

    scope_path_lookup = "path"  # the scope's path, from the listed model

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> Any:
        found, duplicates = super().get_search_results(  # type: ignore[misc]
            request, queryset, search_term
        )
        term = search_term.strip()
        if "/" in term:
            found = found | queryset.filter(**{self.scope_path_lookup: term.split("/")})
        return found, duplicates


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the service writes and nobody edits: listed and read, never changed."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(APIKey)
class APIKeyAdmin(NoDjangoDeleteMixin, admin.ModelAdmin):  # (revoked, never deleted)
    list_display = ["prefix", "name", "owner", "read_only", "narrowed_to", "last_used_at", "state"]
    list_filter = ["revoked_at", "read_only"]
    list_select_related = ["owner"]
    search_fields = ["prefix", "name", "owner__username"]
    autocomplete_fields = ["owner"]  # chosen by username
    readonly_fields = ["prefix", "read_only", "expires_at", *LIMIT_NAMES, "created_at",
                       "last_used_at", "revoked_at"]  # fmt: skip
    actions = ["revoke_keys"]

    @admin.display(description="state", ordering="revoked_at")
    def state(self, obj: APIKey) -> str:
        if obj.revoked_at is not None:
            return f"revoked {obj.revoked_at:%Y-%m-%d}"
        if obj.expires_at is None:
            return "active"
        word = "expired" if obj.expires_at <= timezone.now() else "expires"
        return f"{word} {obj.expires_at:%Y-%m-%d %H:%M}"

    @admin.display(description="limits")
    def narrowed_to(self, obj: APIKey) -> str:
        """The key's limits in a line: each kind with how many it names (none: "-")."""
        limits = KeyLimits.of(obj)
        if limits is None:
            return "-"
        parts = []
        for name, value in limits.payload().items():
            if name == "scope" and value is not None:
                parts.append("scope " + "/".join(value))
            elif value is not None:
                parts.append(
                    f"{name.replace('_', ' ')}: {', '.join(value) or 'none'}"
                    if name == "tools"
                    else f"{len(value)} {name.replace('_', ' ')}"
                )
        return "; ".join(parts)

    def get_form(self, request, obj=None, change=False, **kwargs):  # type: ignore[no-untyped-def]
        if obj is None:
            kwargs["form"] = APIKeyAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        if obj is None:
            return KEY_FIELDS
        return ["owner", "name", "prefix", "read_only", "expires_at", *LIMIT_NAMES, "created_at",
                "last_used_at", "revoked_at"]  # fmt: skip

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        if obj is None:  # (a new key's limits are chosen once, here)
            return ["prefix", "created_at", "last_used_at", "revoked_at"]
        return self.readonly_fields + ["owner"]

    def save_model(self, request: HttpRequest, obj: APIKey, form, change: bool) -> None:  # type: ignore[no-untyped-def]
        if change:
            obj.save(update_fields=["name"])
            return
        limits = {
            n: [str(v) for v in getattr(obj, n)] for n in LIMIT_NAMES if getattr(obj, n)
        }  # fmt: skip  (an empty field: not narrowed)
        api_key, raw_key = api_key_create(owner=obj.owner, name=obj.name, read_only=obj.read_only,
                                          expires_at=obj.expires_at, limits=limits)  # fmt: skip
        obj.pk = api_key.pk
        obj.prefix, obj.digest, obj.created_at = api_key.prefix, api_key.digest, api_key.created_at
        self.message_user(
            request,
            f"New API key (shown once, copy it now): {raw_key}",
            level=messages.WARNING,
        )

    @admin.action(description="Revoke selected API keys", permissions=["change"])
    @confirm_first(
        title="Revoke these API keys?",
        consequences=["stop them working at once; a revoked key cannot be restored."],
        button="Yes, revoke",
    )
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[APIKey]) -> None:
        keys = list(queryset)
        already = sum(1 for api_key in keys if api_key.revoked_at is not None)
        for api_key in keys:
            api_key_revoke(api_key=api_key)
        said = f"Revoked {len(keys) - already} key(s)."
        if already:  # (counted apart: nothing happened to them)
            said += f" {already} already revoked, unchanged."
        self.message_user(request, said)


# Repeated wrong passwords are refused unchecked for a while (core.login_throttle).
admin.site.login_form = ThrottledAdminLoginForm


class UsagePeriodFilter(admin.SimpleListFilter):
    title = "period"
    parameter_name = "period"

    def lookups(self, request, model_admin):  # type: ignore[no-untyped-def]
        return [("30", "Last 30 days"), ("7", "Last 7 days"), ("1", "Today")]

    def queryset(self, request, queryset):  # type: ignore[no-untyped-def]
        if self.value() is None:
            return queryset
        since = timezone.now().date() - timedelta(days=int(self.value()) - 1)
        return queryset.filter(day__gte=since)


@admin.register(UsageDay)
class UsageDayAdmin(ReadOnlyAdmin):
    """What each owner's work spent per day, kind, model and end user (``core.usage``):
    read only, written by the calls themselves."""

    list_display = ["day", "owner", "work", "subject", "model", "calls_made", "tokens"]
    list_filter = [UsagePeriodFilter, "kind", "model"]
    list_select_related = ["owner"]
    search_fields = ["owner__username", "subject", "model"]
    date_hierarchy = "day"
    ordering = ["-day", "owner", "kind", "model", "subject"]

    @admin.display(description="kind", ordering="kind")
    def work(self, obj: UsageDay) -> str:
        return obj.kind

    @admin.display(description="calls", ordering="calls")
    def calls_made(self, obj: UsageDay) -> str:
        estimated = f" ({obj.estimated_calls:,} estimated)" if obj.estimated_calls else ""
        return f"{obj.calls:,}{estimated}"

    @admin.display(description="tokens in / out", ordering="tokens_in")
    def tokens(self, obj: UsageDay) -> str:
        return f"{obj.tokens_in:,} / {obj.tokens_out:,}"


class UsageBudgetForm(OwnerValidatedForm):
    def clean_daily_tokens(self) -> int | None:
        value = self.cleaned_data.get("daily_tokens")
        if value is not None and not 0 <= value <= MAX_DAILY_TOKENS:  # (as PATCH /me)
            raise forms.ValidationError(f"From 0 to {MAX_DAILY_TOKENS:,}, or empty.")
        return value


@admin.register(UsageBudget)
class UsageBudgetAdmin(OwnerFixedAdmin):
    """Each owner's daily token budget for background work and what it spent today;
    deferred runs show when it ran out."""

    form = UsageBudgetForm

    list_display = ["owner", "own_budget", "in_force", "spent_today", "deferred_at",
                    "runs_deferred"]  # fmt: skip
    list_select_related = ["owner"]
    search_fields = ["owner__username"]
    autocomplete_fields = ["owner"]
    fields = ["owner", "daily_tokens", "deferred_at", "deferred_runs"]
    readonly_fields = ["deferred_at", "deferred_runs"]

    @admin.display(description="daily tokens", ordering="daily_tokens")
    def own_budget(self, obj: UsageBudget) -> str:
        return "(the default)" if obj.daily_tokens is None else f"{obj.daily_tokens:,}"

    @admin.display(description="runs deferred that day", ordering="deferred_runs")
    def runs_deferred(self, obj: UsageBudget) -> int:
        return obj.deferred_runs

    @staticmethod
    def _today(obj: UsageBudget) -> Budget:
        """The row's budget today, read once for both columns."""
        if not hasattr(obj, "_today"):
            obj._today = budget_of(obj.owner_id)  # type: ignore[attr-defined]
        return obj._today  # type: ignore[attr-defined]

    @admin.display(description="in force today")
    def in_force(self, obj: UsageBudget) -> str:
        cap = self._today(obj).daily_tokens
        return "no cap" if cap is None else f"{cap:,}"

    @admin.display(description="spent today")
    def spent_today(self, obj: UsageBudget) -> str:
        return f"{self._today(obj).spent:,}"


@admin.register(AccessEvent)
class AccessEventAdmin(ReadOnlyAdmin):
    """The audit trail of access (``core.audit``): keys created and revoked, erasures;
    who, with which key, from where, when. Read only: written by the actions themselves,
    never edited or deleted here."""

    list_display = ["at", "owner", "action", "actor", "about", "address"]
    list_filter = ["action"]
    list_select_related = ["owner", "key", "subject_key"]
    search_fields = ["owner__username", "actor", "address"]
    date_hierarchy = "at"
    ordering = ["-at", "-id"]

    @admin.display(description="about")
    def about(self, obj: AccessEvent) -> str:
        """The key created or revoked, or what an erasure removed (its non-zero counts)."""
        if obj.subject_key is not None:
            return f"key {obj.subject_key.prefix}…"
        counts = obj.detail.get("counts") or {}
        removed = ", ".join(f"{n:,} {k}" for k, n in counts.items() if n)
        kind = str(obj.detail.get("scope_kind", ""))
        return f"{kind}: {removed}" if removed else kind


class OwnerChoosingUserAdmin(UserAdmin):
    """Django's user admin, but the owner boxes of the rows an operator may add or change
    (an API key, a budget, a flow, a memory store: chosen by username) answer them
    without the permission to view users: Django's autocomplete asks for it, so an
    operator granted the keys alone found no owner to give a new key."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or (
            obj is None and _chooses_an_owner(request)
        )

    def get_search_fields(self, request: HttpRequest) -> Any:
        if not super().has_view_permission(request) and _chooses_an_owner(request):
            return ("username",)  # (not their names or addresses: the box shows usernames)
        return super().get_search_fields(request)


def _chooses_an_owner(request: HttpRequest) -> bool:
    """An autocomplete request for the ``owner`` field of a model whose admin offers it
    as an autocomplete and lets the user add or change its rows."""
    match = getattr(request, "resolver_match", None)
    if match is None or match.url_name != "autocomplete":
        return False
    if request.GET.get("field_name") != "owner":
        return False
    try:
        model = apps.get_model(request.GET.get("app_label", ""), request.GET.get("model_name"))
    except (LookupError, ValueError):
        return False
    model_admin = admin.site._registry.get(model)
    return model_admin is not None and (
        "owner" in model_admin.get_autocomplete_fields(request)
        and (model_admin.has_add_permission(request) or model_admin.has_change_permission(request))
    )


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), OwnerChoosingUserAdmin)
