"""The engine's storage fixture for its background pipelines (ingestion.updates)."""

from tests.memories.engine.scripted import engine_storage  # noqa: F401
