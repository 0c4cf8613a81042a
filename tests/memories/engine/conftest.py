from tests.memories.engine.scripted import engine_storage  # noqa: F401
from tests.memories.facts.conftest import fixture_embedder  # noqa: F401
