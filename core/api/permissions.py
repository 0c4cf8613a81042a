"""What a narrowed API key may do (issue 30): checked for every view, after
authentication (``REST_FRAMEWORK["DEFAULT_PERMISSION_CLASSES"]``).

A read-only key reads: ``GET`` and the views that read by ``POST`` (searches, retrieval,
an injection's block; they say so with ``reads = True``). Anything else, the chat proxy
included (its answers would teach the end user's memory), is a 403 ``read_only_key``
before the view runs, so nothing changes. The tools endpoint and MCP read by ``POST``
too: there each tool that writes is refused on its own (``memories.tools.registry``).

A key narrowed to named resources, a scope or tools (``core.key_limits``) is held by the
selectors; what spans the whole account (a view's ``owner_wide`` methods: the export, the
import, creating and revoking keys, the account's settings) is a 403 ``key_limit`` here.
"""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from core.errors import ReadOnlyKey
from core.key_limits import owner_wide_check
from core.models import APIKey

REFUSED = "This API key is read-only: it reads and searches, and changes nothing."


class KeyAllows(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        key = request.auth if isinstance(request.auth, APIKey) else None
        if key is None:
            return True
        if request.method in getattr(view, "owner_wide", ()):
            owner_wide_check()
        if not key.read_only or request.method in permissions.SAFE_METHODS:
            return True
        if getattr(view, "reads", False):
            return True
        raise ReadOnlyKey(REFUSED)


def refuse_read_only(request: Request) -> None:
    """A 403 ``read_only_key`` for a read-only key's ``GET`` that writes (a history with
    ``strategy=summarize`` advances the running summary with the chat LLM): called by the
    view before anything runs, as ``KeyAllows`` refuses any other write."""
    key = request.auth if isinstance(request.auth, APIKey) else None
    if key is not None and key.read_only:
        raise ReadOnlyKey(REFUSED)
