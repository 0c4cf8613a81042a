"""Content negotiation: a ``?format=`` no renderer of the view writes is a 400 naming
``format`` (DRF answers 404 "Not found." for it, as if the path did not exist)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.http import Http404
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from core.errors import InvalidInput


class ContentNegotiation(DefaultContentNegotiation):
    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> Any:
        renderers = list(renderers)
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except Http404:
            known = ", ".join(dict.fromkeys(str(r.format) for r in renderers))
            said = f"this path answers in {known}"
            raise InvalidInput.at("format", said) from None
