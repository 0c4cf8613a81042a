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
