from tests.memories.engine.scripted import engine_storage  # noqa: F401
from tests.memories.personal.conftest import fixture_embedder  # noqa: F401
