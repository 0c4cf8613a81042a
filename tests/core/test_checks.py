import pytest

from core.checks import provider_configuration

pytestmark = pytest.mark.django_db


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
