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


def test_a_variable_no_longer_read_that_is_still_set_is_named(monkeypatch):
    from django.core.checks import run_checks

    for name in ("Q_SYNC", "CHAT_MODELS", "SEARCH_BM25_K1"):
        monkeypatch.delenv(name, raising=False)
    assert [m for m in run_checks() if m.id == "core.W003"] == []
    monkeypatch.setenv("CHAT_MODELS", "a,b")
    monkeypatch.setenv("Q_SYNC", "true")
    monkeypatch.setenv("SEARCH_BM25_K1", "1.2")
    monkeypatch.setenv("LLM_MODEL", "still-read")  # a variable still read: not named
    (warning,) = [m for m in run_checks() if m.id == "core.W003"]
    assert warning.msg == "Set but no longer read (ignored): CHAT_MODELS, Q_SYNC, SEARCH_BM25_K1."
    assert "Upgrade notes" in warning.hint
