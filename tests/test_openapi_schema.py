"""The OpenAPI schema is generated without errors and without two serializers published
under one component name (drf-spectacular then keeps one of them: the schema silently
lost the fields of the other, e.g. ``type`` at the personal doors)."""

from __future__ import annotations

from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator


def test_every_component_is_one_serializer_and_no_view_is_skipped(capsys):
    GENERATOR_STATS.reset()
    schema = SchemaGenerator().get_schema(request=None, public=True)
    printed = capsys.readouterr().err
    assert "identical names" not in printed
    assert "Error" not in printed, printed
    components = schema["components"]["schemas"]
    assert "type" in components["Memory"]["properties"]
    assert "type" in components["MemoryHit"]["properties"]
    assert "scope" in components["ScopedFact"]["properties"]
    erase = schema["paths"]["/api/v1/engine/erase"]["post"]["responses"]["200"]
    assert erase["content"]["application/json"]["schema"]["$ref"].endswith("/ErasedScope")


def test_the_answers_a_new_users_audit_met_are_in_the_schema():
    """422 dream_too_lossy, 409 duplicate_fact from a tool, 502 from a provider (the
    summaries' LLM): answered, and missing from the schema."""
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]

    def statuses(path: str, method: str = "post") -> set[str]:
        return set(paths[path][method]["responses"])

    assert {"422", "502", "409"} <= statuses("/api/v1/engine/dream")
    assert {"409", "502"} <= statuses("/api/v1/tools/{name}/call")
    assert "502" in statuses("/api/v1/engine/summaries")
    assert "502" in statuses("/api/v1/conversations/{session_id}/history", "get")  # summarize
    # the chat proxy's own request field, which the docs name and the proxy reads
    chat = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    assert chat["ChatCompletionRequest"]["properties"]["memory_tools"]["type"] == "boolean"
