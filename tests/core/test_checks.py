import pytest

from core.checks import knowledge_base_embedding_mismatch, provider_configuration
from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db


def test_mismatch_between_stored_bases_and_configured_provider(alice, settings):
    make_kb(alice)  # created with hashing-v1 / 384
    assert knowledge_base_embedding_mismatch(None) == []
    settings.EMBEDDING_PROVIDER = "openai"
    settings.EMBEDDING_MODEL = "text-embedding-3-small"
    settings.EMBEDDING_DIMENSIONS = 1536
    warnings = knowledge_base_embedding_mismatch(None)
    assert [w.id for w in warnings] == ["core.W002"]
    assert "hashing/hashing-v1 (384 dims)" in warnings[0].msg
    assert "openai/text-embedding-3-small (1536 dims)" in warnings[0].msg


def test_provider_configuration_errors(settings):
    settings.EMBEDDING_PROVIDER = "local"
    settings.EMBEDDING_DIMENSIONS = 768
    settings.LLM_BASE_URL = "http://127.0.0.1:1/v1"
    assert [e.id for e in provider_configuration(None)] == ["core.E001"]
    settings.EMBEDDING_PROVIDER = "openai"
    settings.EMBEDDING_BASE_URL = ""
    settings.EMBEDDING_API_KEY = ""
    assert "core.E002" in [e.id for e in provider_configuration(None)]
    settings.LLM_BASE_URL = ""
    assert "core.W001" in [e.id for e in provider_configuration(None)]
