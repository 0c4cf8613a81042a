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


@pytest.mark.django_db
def test_the_checks_see_every_owners_bases_as_a_serving_process_does(alice, settings):
    """Under ``manage.py serve`` a check runs as nobody (tenancy.for_command): row-level
    security refused its query, the check swallowed the error, and an embedding change
    was never reported at start-up (an operator's audit)."""
    from core import tenancy
    from memories.stores.checks import memory_store_embedding_mismatch
    from memories.stores.models import MemoryStore

    make_kb(alice)
    MemoryStore.objects.create(owner=alice, name="notes", type="simple", config={},
                               embedding_provider="hashing", embedding_model="hashing-v1",
                               embedding_dimensions=384)  # fmt: skip
    settings.EMBEDDING_PROVIDER = "openai"
    settings.EMBEDDING_MODEL = "text-embedding-3-small"
    settings.EMBEDDING_DIMENSIONS = 1536
    with tenancy.nobody():
        assert [w.id for w in knowledge_base_embedding_mismatch(None)] == ["core.W002"]
        assert [w.id for w in memory_store_embedding_mismatch(None)] == ["memory_stores.W001"]
