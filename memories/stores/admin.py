"""Memory stores in the admin: create and edit stores and their node attachments, browse
and delete items.

Every check is the API's: the store form asks the services the API's views call
(``memory_store_validate_new`` / ``memory_store_validate_change``: the type's config
class, the name, the embedding lock, what loading would refuse) and the attachment rows
go through the config document's checks (``attachment_validate``,
``attachment_write_check``); nothing is saved unless all pass. A store is loaded (a file
store indexes its files) once the page's transaction has committed: loading embeds, and
network calls stay outside transactions.
"""

from __future__ import annotations

import functools
from contextlib import suppress
from typing import Any

import yaml
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import RelatedFieldWidgetWrapper
from django.db import transaction
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from core.admin_confirm import confirm_first
from core.api.parsers import UnstorableInput, check_parsed, too_deep, unstorable_message
from core.errors import NameTaken, NotFound, ServiceError
from core.validation import NODE_ID
from memories.conversations.models import Flow
from memories.stores.api.parsers import yaml_load
from memories.stores.config import attached_twice, attachment_validate, attachment_write_check
from memories.stores.models import STAGES, MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.registry import store_type, store_types
from memories.stores.services import (
    ConfigInvalid,
    backend_for,
    memory_store_create,
    memory_store_delete,
    memory_store_load,
    memory_store_problem,
    memory_store_update,
    memory_store_validate_change,
    memory_store_validate_new,
)

CONFIG_HELP = (
    "YAML or JSON, checked by the type's config class; empty: the type's defaults. "
    "An <code>embedding</code> block (provider, model, api_key, base_url, params) is "
    "optional: without one the store embeds with the service default. Keys are "
    "environment references such as <code>${API_KEY}</code>, stored as written and "
    "resolved when used."
)


def _as_text(config: dict[str, Any]) -> str:
    """The config as YAML to edit, without the settings left empty (``embedding: null``,
    ``memory_path: ''``): saved again, the type's validation puts them back."""
    shown = {k: v for k, v in config.items() if v not in (None, "")}
    return yaml.safe_dump(shown, sort_keys=False, allow_unicode=True) if shown else ""


def _field_line(spec: dict[str, Any]) -> str:
    default = spec.get("default")
    shown = "" if default in (None, "", [], {}) else f" = {default}"
    return f"{spec['name']}{shown}"


def types_reference() -> str:
    """Each registered type, its summary and its config fields (with defaults)."""
    rows = (
        (kind.name, kind.summary, ", ".join(_field_line(f) for f in kind.field_specs()))
        for kind in store_types()
    )
    return format_html(
        '<dl class="store-types">{}</dl>',
        format_html_join("", "<dt>{}</dt><dd>{}<br><small>{}</small></dd>", rows),
    )


class StoreForm(forms.ModelForm):
    type = forms.ChoiceField(
        choices=(), help_text="From the registry (described below); fixed once created."
    )
    config = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 10, "class": "store-config", "spellcheck": "false"}),
        help_text=CONFIG_HELP,
    )

    class Meta:
        model = MemoryStore
        fields = ["owner", "name", "type", "config"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.valid_config: dict[str, Any] | None = None  # what the type's validation made of it
        if "name" in self.fields:
            self.fields["name"].help_text = "Unique per owner: 1-100 letters, digits and . _ -"
        if "type" in self.fields:
            choices = [
                (t.name, f"{t.name} (read-only)" if t.read_only else t.name) for t in store_types()
            ]
            self.fields["type"].choices = [("", "---------"), *choices]
        if not self.instance._state.adding:
            self.initial["config"] = _as_text(self.instance.config)

    def clean_config(self) -> dict[str, Any]:
        text = self.cleaned_data.get("config") or ""
        try:
            value = yaml_load(text) if text.strip() else {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            raise forms.ValidationError(f"Not YAML or JSON{where}: {exc}") from None
        except RecursionError:  # (nested past the parser's own depth: it was a 500)
            raise forms.ValidationError(unstorable_message(too_deep())) from None
        try:  # (what the API's parsers refuse: too deep, NaN, NUL...)
            check_parsed(value)
        except UnstorableInput as exc:
            raise forms.ValidationError(unstorable_message(exc)) from None
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError("The config is a mapping: key: value lines, or an object.")
        return value

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if self.errors:  # the services need every field: check once those are right
            return data
        try:
            if self.instance._state.adding:
                valid = memory_store_validate_new(
                    owner=data["owner"], name=data["name"], type=data["type"], config=data["config"]
                )
            else:
                valid = memory_store_validate_change(store=self.instance, config=data["config"])
        except ConfigInvalid as exc:
            for place, problems in exc.details.items():
                self._place_errors(place, problems)
        except NameTaken as exc:
            self.add_error("name", str(exc))
        except ServiceError as exc:  # the embedding lock, an unset ${VAR}
            self.add_error("config", str(exc))
        else:
            self.valid_config = valid.config
        return data

    def _place_errors(self, place: str, problems: list[str]) -> None:
        field = place.split(".", 1)[0]
        if field in ("name", "type") and field in self.fields:
            self.add_error(field, problems)
            return
        where = place.removeprefix("config").lstrip(".")
        self.add_error("config", [f"{where}: {p}" if where else p for p in problems])


class StagesField(forms.MultipleChoiceField):
    """Offered as checkboxes; what is posted is checked by ``attachment_validate`` (as in
    a config document), not here."""

    def validate(self, value: Any) -> None:
        return None


class AttachmentForm(forms.ModelForm):
    retrieve_stage = StagesField(
        choices=[(s, s) for s in STAGES],
        required=False,
        widget=forms.CheckboxSelectMultiple(attrs={"class": "stages"}),
        label="stages",
        help_text="None ticked: every stage.",
    )

    class Meta:
        model = MemoryAttachment
        fields = [
            "flow",
            "node_id",
            "position",
            "retrieve_stage",
            "top_k",
            "similarity_threshold",
            "read",
            "write",
        ]
        labels = {"node_id": "node", "similarity_threshold": "threshold"}
        widgets = {
            "node_id": forms.TextInput(attrs={"size": 16}),
            "position": forms.NumberInput(attrs={"class": "narrow"}),
            "top_k": forms.NumberInput(attrs={"class": "narrow"}),
            "similarity_threshold": forms.NumberInput(attrs={"class": "narrow", "step": "0.05"}),
        }

    def __init__(self, *args: Any, store: MemoryStore, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store = store  # the page's store, saved or not yet
        # A saved store's rows offer its owner's flows only; a new store's, every flow
        # (its owner is chosen on the same page; clean() refuses another owner's).
        flows = Flow.objects.select_related("owner").order_by("name", "owner__username")
        if not store._state.adding:
            flows = flows.filter(owner_id=store.owner_id)
        field = self.fields["flow"]
        field.queryset = flows
        field.label_from_instance = lambda flow: f"{flow.name} ({flow.owner.username})"

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        store = self.store
        flow = data.get("flow")
        if flow is not None and store.owner_id and flow.owner_id != store.owner_id:
            self.add_error("flow", f"flow {flow.name!r} is not the store owner's")
        node_id = data.get("node_id")
        if node_id is not None and not NODE_ID.matches(node_id):
            self.add_error("node_id", NODE_ID.message)
        raw = {
            key: data[key]
            for key in AttachmentForm.Meta.fields[3:]
            if data.get(key) is not None and key not in self.errors
        }
        errors: dict[str, list[str]] = {}
        attachment = attachment_validate({"name": store.name, **raw}, where="", errors=errors)
        if attachment is not None:
            kind = store_type(store.type)
            read_only = bool(kind and kind.read_only)
            attachment_write_check(attachment, read_only=read_only, where="", errors=errors)
        for place, problems in errors.items():
            field = place.lstrip(".").split("[", 1)[0].split(".", 1)[0]
            self.add_error(field if field in self.fields else None, problems)
        return data


class AttachmentFormSet(BaseInlineFormSet):
    def get_form_kwargs(self, index: int | None) -> dict[str, Any]:
        return {**super().get_form_kwargs(index), "store": self.instance}

    def clean(self) -> None:
        seen: set[tuple[Any, str]] = set()
        for form in self.forms:
            data = getattr(form, "cleaned_data", None)
            if not data or data.get("DELETE") or form.errors:
                continue
            node = (data.get("flow"), data.get("node_id"))
            if node in seen:
                raise forms.ValidationError(attached_twice(self.instance.name))
            seen.add(node)
        super().clean()


class AttachmentInline(admin.TabularInline):
    model = MemoryAttachment
    form = AttachmentForm
    formset = AttachmentFormSet
    extra = 0
    show_change_link = False
    verbose_name = "node attachment"
    verbose_name_plural = "attached to agent nodes"

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryAttachment]:
        return super().get_queryset(request).select_related("store", "flow__owner")

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name == "flow" and isinstance(field.widget, RelatedFieldWidgetWrapper):
            field.widget = field.widget.widget  # a choice of flows: no add/change/view icons
        return field


def _load_summary(report: dict[str, Any]) -> str:
    if report.get("busy"):
        return "another load of it is running"
    files = ", ".join(
        f"{report[k]} {k}" for k in ("added", "updated", "unchanged", "deleted", "skipped")
    )
    return f"files {files}; {report['chunks_written']} chunks written"


@admin.register(MemoryStore)
class MemoryStoreAdmin(admin.ModelAdmin):
    form = StoreForm
    list_display = ["name", "owner", "type", "item_count", "health", "updated_at"]
    list_filter = ["type"]
    list_select_related = ["owner", "knowledge_base"]
    search_fields = ["name", "owner__username"]
    ordering = ["owner__username", "name"]  # (a stable order to page through)
    autocomplete_fields = ["owner"]  # chosen by username
    inlines = [AttachmentInline]
    actions = ["load_stores", "delete_with_items"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryStore]:
        return super().get_queryset(request).annotate(own_items=Count("items"))

    def get_fields(self, request: HttpRequest, obj: MemoryStore | None = None) -> Any:
        if obj is None:
            return ["owner", "name", "type", "config", "types"]
        return ["name", "owner", "type", "config", "embedding", "item_count", "knowledge_base"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return ["types"]
        return ["name", "owner", "type", "embedding", "item_count", "knowledge_base"]

    @admin.display(description="health")
    def health(self, obj: MemoryStore) -> str:
        problem = memory_store_problem(store=obj) if store_type(obj.type) else "unknown type"
        if problem is None:
            return "ok"
        return format_html('<strong style="color:#ba2121">⚠ {}</strong>', problem)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        if request.method == "GET":
            for store in self.get_queryset(request):
                problem = memory_store_problem(store=store) if store_type(store.type) else None
                if problem is not None:
                    self.message_user(request, f"Memory store {store.name}: {problem}; its "
                                      "nodes answer without it", messages.WARNING)  # fmt: skip
        return super().changelist_view(request, extra_context)

    @admin.display(description="items", ordering="own_items")
    def item_count(self, obj: MemoryStore) -> int:
        counted = backend_for(obj).item_count()
        return counted if counted is not None else obj.own_items  # type: ignore[attr-defined]

    @admin.display(description="embedding")
    def embedding(self, obj: MemoryStore) -> str:
        if not obj.embedding_provider or obj.embedding_provider == "none":
            return "none (recency)" if obj.embedding_provider == "none" else "-"
        source = "its embedding block" if obj.has_own_embedding else "the service default"
        return (
            f"{obj.embedding_provider}/{obj.embedding_model} "
            f"({obj.embedding_dimensions} dims), from {source}"
        )

    @admin.display(description="store types")
    def types(self, obj: Any = None) -> str:
        return types_reference()

    def save_model(self, request: HttpRequest, obj: MemoryStore, form: Any, change: bool) -> None:
        config = form.cleaned_data["config"]
        if change:
            current = MemoryStore.objects.get(pk=obj.pk)
            if form.valid_config == current.config:  # only the attachments changed
                return
            saved, _ = memory_store_update(store=current, config=config, load=False)
        else:
            saved, _ = memory_store_create(
                owner=obj.owner, name=obj.name, type=obj.type, config=config, load=False
            )
        for field in MemoryStore._meta.concrete_fields:  # the rows below attach to it
            setattr(obj, field.attname, getattr(saved, field.attname))
        obj._state.adding, obj._state.db = False, saved._state.db
        transaction.on_commit(functools.partial(self._load, request, saved))

    def _load(self, request: HttpRequest, store: MemoryStore) -> bool:
        """Load ``store``, saying how it went; False when its type loads nothing."""
        try:
            report = memory_store_load(store=store)
        except ServiceError as exc:
            self.message_user(
                request,
                f"{store.name} is saved, but loading it failed: {exc}. Try the action "
                "“Load selected stores” again.",
                messages.ERROR,
            )
            return True
        if report is None:
            return False
        self.message_user(request, f"Loaded {store.name}: {_load_summary(report)}.")
        return True

    @admin.action(
        description="Load selected stores (a file store indexes changed files)",
        permissions=["change"],
    )
    def load_stores(self, request: HttpRequest, queryset: QuerySet[MemoryStore]) -> None:
        idle = [store.name for store in queryset.select_related("knowledge_base")
                if not self._load(request, store)]  # fmt: skip
        if idle:  # (it said nothing, and the operator could not tell whether it ran)
            self.message_user(
                request, f"Nothing to load for {', '.join(idle)}: only a file store loads files."
            )

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def delete_model(self, request: HttpRequest, obj: MemoryStore) -> None:
        memory_store_delete(store=obj)

    @admin.action(
        description="Delete selected stores with their items and attachments",
        permissions=["delete"],
    )
    @confirm_first(
        title="Delete these memory stores?",
        consequences=[
            "delete the stores and every item they hold (this cannot be undone),",
            "detach them from every agent node they are attached to.",
            "A file store's files on disk are kept.",
        ],
        button="Yes, delete",
    )
    def delete_with_items(self, request: HttpRequest, queryset: QuerySet[MemoryStore]) -> None:
        names = []
        for store in list(queryset):
            with suppress(NotFound):  # (deleted meanwhile by someone else: gone all the same)
                memory_store_delete(store=store)
            names.append(store.name)
        self.message_user(request, f"Deleted {', '.join(names)} with their items and attachments.")


@admin.register(MemoryItem)
class MemoryItemAdmin(admin.ModelAdmin):
    """Items per store: browse and delete; the embedding is never loaded or rendered."""

    list_display = ["id", "store", "excerpt", "session_id", "created_at"]
    list_filter = [("store", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["store"]
    search_fields = ["content_summary", "=session_id"]
    raw_id_fields = ["store"]
    exclude = ["embedding"]
    readonly_fields = [
        "store",
        "content_summary",
        "summary_hash",
        "input_snapshot",
        "output_snapshot",
        "metadata",
        "session_id",
        "created_at",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[MemoryItem]:
        return super().get_queryset(request).defer("embedding")

    @admin.display(description="summary")
    def excerpt(self, obj: MemoryItem) -> str:
        return obj.content_summary[:100]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
