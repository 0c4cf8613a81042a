from typing import Any

from rest_framework import pagination


class PageNumberPagination(pagination.PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500


def paginated_response(view: Any, request: Any, qs: Any, serializer: Any) -> Any:
    """``{"count", "next", "previous", "results"}`` for one page of ``qs``."""
    paginator = PageNumberPagination()
    page: Any = paginator.paginate_queryset(qs, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)
