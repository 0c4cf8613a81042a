"""The engine's storage fixture for its background pipelines (ingestion.updates), and a
scripted extraction for three user messages."""

import pytest

from tests.memories.engine.scripted import EngineLLM, engine_storage, fact  # noqa: F401

TEA = "I drink green tea every morning"
RUST = "I am learning Rust this year"
DARK = "Please use dark mode, always"


@pytest.fixture
def engine_llm(llm_settings, openai_server, engine_storage, settings):  # noqa: F811
    """The extraction of TEA, RUST and DARK, and a 30 s window."""
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 30
    script = EngineLLM({
        TEA: [fact("User drinks green tea every morning", "behavior", 0.95)],
        RUST: [fact("User is learning Rust", "goal", 0.9), fact("User may like Go", "preference", 0.4)],
        DARK: [fact("User prefers dark mode", "preference", 0.98)],
    })  # fmt: skip
    openai_server.chat_fn = script
    return script
