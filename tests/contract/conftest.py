from tests.memories.engine.scripted import engine_storage  # noqa: F401
