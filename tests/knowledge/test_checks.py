import pytest

from knowledge.checks import knowledge_base_embedding_mismatch
from tests.knowledge.factories import make_kb


@pytest.mark.django_db
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


def test_query_rewriting_on_without_an_llm_warns(settings):
    from knowledge.checks import query_rewriting_without_llm

    settings.SEARCH_REWRITE = False
    settings.LLM_BASE_URL = ""
    assert query_rewriting_without_llm(None) == []
    settings.SEARCH_REWRITE = True
    (warning,) = query_rewriting_without_llm(None)
    assert warning.id == "knowledge.W001" and "LLM_BASE_URL" in warning.hint
    settings.LLM_BASE_URL = "http://127.0.0.1:9/v1"
    assert query_rewriting_without_llm(None) == []
