from typing import Any

from rest_framework import pagination
from rest_framework.exceptions import ValidationError


def _positive_int(request: Any, name: str, maximum: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1 or (maximum is not None and value > maximum):
        bound = f" up to {maximum}" if maximum else ""
        raise ValidationError({name: [f"Must be a whole number from 1{bound}."]})
    return value


class PageNumberPagination(pagination.PageNumberPagination):
    """``?page=N&page_size=M``; a malformed one is a 400 (DRF would quietly use the
    default size, or answer 404 for page=abc), a page past the last one a 404."""

    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Any) -> int | None:
        size = _positive_int(request, self.page_size_query_param, self.max_page_size)
        return size if size is not None else self.page_size

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> Any:
        _positive_int(request, self.page_query_param)
        return super().paginate_queryset(queryset, request, view)


def paginated_response(view: Any, request: Any, qs: Any, serializer: Any) -> Any:
    """``{"count", "next", "previous", "results"}`` for one page of ``qs``."""
    paginator = PageNumberPagination()
    page: Any = paginator.paginate_queryset(qs, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)
