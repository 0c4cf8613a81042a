from tests.memories.personal.conftest import fixture_embedder  # noqa: F401
