"""Confirmation before a destructive admin action: the first POST of the action shows
a page naming the objects and what will happen; only its "Yes" POST runs the action."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django.contrib.admin import ModelAdmin, helpers
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

CONFIRMED = "confirmed"

Action = Callable[[Any, HttpRequest, QuerySet[Any]], HttpResponse | None]


def confirmation_page(
    modeladmin: ModelAdmin,
    request: HttpRequest,
    objects: Sequence[Any],
    *,
    title: str,
    consequences: Sequence[str],
    button: str,
    action: str | None = None,
    cancel_url: str | None = None,
) -> TemplateResponse:
    """The page asking to confirm. With ``action``, its form re-posts the changelist
    action for the same selection; without, it posts back to the current URL."""
    opts = modeladmin.model._meta
    context = {
        "owned": _with_owners(objects),
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "objects": objects,
        "consequences": consequences,
        "button": button,
        "action": action,
        "selected": [str(obj.pk) for obj in objects],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "confirmed_name": CONFIRMED,
        "opts": opts,
        "cancel_url": cancel_url or reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"),
    }
    return TemplateResponse(request, "admin/confirm_action.html", context)


def _with_owners(objects: Sequence[Any]) -> list[tuple[Any, str]]:
    """Each object with its owner's username ("" for one without an owner): two owners'
    objects of one name are told apart on the page. One query for the lot."""
    owners: list[int | None] = [getattr(obj, "owner_id", None) for obj in objects]
    ids = {owner for owner in owners if owner is not None}
    names = dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
    return [(obj, names.get(owner, "") if owner is not None else "")
            for obj, owner in zip(objects, owners, strict=True)]  # fmt: skip


def is_confirmed(request: HttpRequest) -> bool:
    return request.method == "POST" and request.POST.get(CONFIRMED) == "yes"


def confirm_first(
    *, title: str, consequences: Sequence[str], button: str
) -> Callable[[Action], Action]:
    """Wrap an admin action so that it asks first (put ``@admin.action`` above it)."""

    def wrap(func: Action) -> Action:
        @functools.wraps(func)
        def action(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
            if is_confirmed(request):
                return func(modeladmin, request, queryset)
            return confirmation_page(
                modeladmin,
                request,
                list(queryset),
                title=title,
                consequences=consequences,
                button=button,
                action=func.__name__,
            )

        return action

    return wrap
