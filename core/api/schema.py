"""The OpenAPI schema tells the truth (drf-spectacular, checked by schemathesis in
``tests/test_openapi_conformance.py``).

- ``AutoSchema`` tags each operation with its room, takes the summary from the view
  method's docstring (first line) unless ``extend_schema(summary=...)`` gives one, and
  documents the error answers every operation can give, in the project's shape (OpenAI's
  under ``/v1/``): 400 (the middleware checks every query), 401, 403 (a read-only or
  narrowed key's refusal), 429 and 503 always,
  404 with path parameters, 413, 415, 502 and 504 (a provider's failure) with a request
  body.
  Views add their own (409, 422, ...) with ``ERROR``.
- ``paginated(X)`` and ``wrapped("jobs", X)`` describe the list envelopes views answer.
- ``APIKeyScheme`` puts the API key in ``securitySchemes`` (HTTP bearer), so Swagger's
  Authorize takes one.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from rest_framework import serializers

from core.api.fields import StrictCharField, StrictIntegerField
from core.validation import END_USER_ID, NODE_ID, SESSION_ID

# Path parameters named so are these kinds of id: their pattern goes in the schema.
PATH_ID_KINDS = {"user_id": END_USER_ID, "session_id": SESSION_ID, "node_id": NODE_ID}


class ErrorBodySerializer(serializers.Serializer):
    code = StrictCharField(help_text="Machine-readable, e.g. invalid, not_found.")
    message = StrictCharField(help_text="A plain sentence.")
    details = serializers.JSONField(allow_null=True, help_text="Field errors or figures.")


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


class OpenAIErrorBodySerializer(serializers.Serializer):
    message = StrictCharField()
    type = StrictCharField()
    param = StrictCharField(allow_null=True)
    code = StrictCharField(allow_null=True)
    details = serializers.JSONField(allow_null=True, required=False)


class OpenAIErrorSerializer(serializers.Serializer):
    error = OpenAIErrorBodySerializer()


ERROR = ErrorSerializer


class DeletedSerializer(serializers.Serializer):
    deleted = StrictIntegerField(help_text="How many rows were deleted.")


ROOM_TAGS = {
    "memories.proxy": "Chat proxy (OpenAI-compatible)",
    "core": "Accounts",
    "knowledge": "Knowledge bases",
    "memories.conversations": "Conversations",
    "memories.bases": "Memory bases",
    "memories.facts": "Personal memories",
    "memories.stores": "Memory stores",
    "memories.engine": "Memory engine",
    "ingestion": "Capture",
    "memories.tools": "Agent tools and MCP",
}

_ERROR_DESCRIPTIONS = {
    "400": "Invalid input (details name the fields).",
    "401": "No valid API key.",
    "403": "Not for this API key: a read-only key's write (read_only_key), or outside a "
    "narrowed key's limits (key_limit).",
    "404": "Not found (or another owner's).",
    "409": "Conflict with the current state.",
    "413": "Request body too large.",
    "415": "Unsupported media type (send JSON).",
    "422": "Well formed, but cannot be done as asked: it names something that is not "
    "there, or (a dream) would drop more than it may.",
    "429": "Too many requests for this key (see Retry-After).",
    "502": "A provider (the chat LLM or the embedder) failed or answered what cannot be "
    "read: nothing changed.",
    "504": "A provider (the chat LLM or the embedder) timed out: nothing changed.",
    "503": "The database or a provider is unavailable (see Retry-After).",
}

_VERBS = {"get": "Get", "post": "Create", "patch": "Update", "put": "Replace", "delete": "Delete"}


class AutoSchema(SpectacularAutoSchema):
    def get_tags(self) -> list[str]:
        module = self.view.__class__.__module__
        for prefix, tag in ROOM_TAGS.items():
            if module == prefix or module.startswith(prefix + "."):
                return [tag]
        return super().get_tags()

    def get_summary(self) -> str | None:
        explicit = super().get_summary()
        if explicit:
            return explicit
        handler = getattr(self.view, self.method.lower(), None)
        doc = (getattr(handler, "__doc__", None) or "").strip()
        if doc:
            return doc.splitlines()[0].rstrip(".")
        words = [p for p in self.path.strip("/").split("/") if p and not p.startswith("{")]
        return f"{_VERBS.get(self.method.lower(), self.method)} {words[-1].replace('-', ' ')}"

    def _paginated(self) -> bool:
        answer = self.get_response_serializers()
        if isinstance(answer, dict):
            answer = answer.get(200)
        return getattr(answer, "__name__", "").startswith("Paginated")

    def get_operation_id(self) -> str:
        operation_id = super().get_operation_id()
        if self._paginated():
            operation_id = operation_id.removesuffix("_retrieve") + "_list"
        return operation_id

    def _get_parameters(self) -> list[dict[str, Any]]:
        parameters = super()._get_parameters()
        for parameter in parameters:
            kind = PATH_ID_KINDS.get(parameter["name"])
            if parameter["in"] == "path" and kind is not None:
                parameter["schema"] = {
                    "type": "string",
                    "pattern": f"^{kind.regex}$",
                    "maxLength": kind.max_length,
                }
        if self._paginated():
            parameters += [
                {
                    "name": "page",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1},
                    "description": "Page number (404 past the last page).",
                },
                {
                    "name": "page_size",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 500},
                    "description": "Results per page (default API_PAGE_SIZE, at most 500).",
                },
            ]
        return parameters

    def _error_statuses(self) -> list[str]:
        statuses = ["400", "401", "403", "429", "503"]
        if "{" in self.path or self._paginated() or self.method in ("POST", "PUT", "PATCH"):
            statuses.append("404")  # the object of the URL, a page, an id in the body
        if self.method in ("POST", "PUT", "PATCH"):
            # (a write or a search may embed, or ask the chat LLM: a provider's failure)
            statuses += ["413", "415", "502", "504"]
        return statuses

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        error = OpenAIErrorSerializer if self.path.startswith("/v1/") else ErrorSerializer
        for status in self._error_statuses():
            if status not in responses:
                answer = self._get_response_for_code(error, status, direction=direction)
                answer["description"] = _ERROR_DESCRIPTIONS[status]
                responses[status] = answer
        for status, answer in responses.items():
            if status in _ERROR_DESCRIPTIONS and not answer.get("description"):
                answer["description"] = _ERROR_DESCRIPTIONS[status]
        return responses


@cache
def paginated(serializer_class: type[serializers.Serializer]) -> type[serializers.Serializer]:
    """``{"count", "next", "previous", "results": [X]}``, as core.api.pagination answers."""
    name = serializer_class.__name__.removesuffix("Serializer")
    return type(
        f"Paginated{name}ListSerializer",
        (serializers.Serializer,),
        {
            "count": StrictIntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializer_class(many=True),
            "__module__": serializer_class.__module__,
        },
    )


@cache
def wrapped(
    key: str, serializer_class: type[serializers.Serializer], many: bool = True
) -> type[serializers.Serializer]:
    """``{key: [X]}`` (or ``{key: X}``): the envelopes of results, messages, jobs."""
    name = serializer_class.__name__.removesuffix("Serializer")
    suffix = "List" if many else ""
    return type(
        f"{name}{key.title()}{suffix}Serializer",
        (serializers.Serializer,),
        {key: serializer_class(many=many), "__module__": serializer_class.__module__},
    )


class APIKeyScheme(OpenApiAuthenticationExtension):
    target_class = "core.authentication.APIKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key: `Authorization: Bearer <key>` (manage.py "
            "create_api_key, the admin, or POST /api/v1/api-keys).",
        }
