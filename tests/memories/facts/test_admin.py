import pytest

from memories.facts.models import Fact, FactChange, Scope
from memories.facts.scopes import end_user_ensure, global_scope_ensure
from tests.memories.facts.seed import seed

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _embedder(fixture_embedder):
    return fixture_embedder


def test_end_user_page_shows_memories_audit_and_counters(admin_client, alice):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    seed(end_user, "User plays the violin", reason="told us")
    listing = admin_client.get("/admin/memories/scope/").content.decode()
    assert (
        "u1" in listing and "memory_total_count" in listing and "memory_additions_total" in listing
    )
    detail = admin_client.get(f"/admin/memories/scope/{end_user.pk}/change/").content.decode()
    assert "User plays the violin" in detail
    assert "told us" in detail  # the audit trail inline
    assert "embedding" not in detail.lower()


def test_erase_action(admin_client, alice):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    seed(end_user, "User plays the violin")
    asked = admin_client.post(
        "/admin/memories/scope/", {"action": "erase", "_selected_action": [end_user.pk]}
    )
    assert "Erase these scopes?" in asked.content.decode()
    assert Scope.objects.exists() and Fact.objects.exists()  # only asked so far
    admin_client.post(
        "/admin/memories/scope/",
        {"action": "erase", "_selected_action": [end_user.pk], "confirmed": "yes"},
    )
    assert not Scope.objects.exists() and not Fact.objects.exists()


def test_global_memory_created_through_admin_is_embedded(admin_client, alice):
    response = admin_client.post(
        "/admin/memories/globalmemory/add/",
        {"owner": alice.pk, "content": "The API rate limit is 100 requests per minute"},
        follow=True,
    )
    assert response.status_code == 200
    fact = Fact.objects.get()
    assert (fact.scope.path, fact.owner, fact.dimensions) == ([], alice, 384)
    assert (fact.source_kind, fact.source_ref, fact.tokens) == ("api", "admin", 19)
    (change,) = FactChange.objects.all()
    assert (change.action, change.scope, change.reason) == ("add", fact.scope, "added in the admin")
    listed = admin_client.get("/admin/memories/globalmemory/").content.decode()
    assert "The API rate limit is 100 requests per minute" in listed


def test_global_memory_deleted_through_admin_is_audited(admin_client, alice):
    scope = global_scope_ensure(owner=alice)
    (fact,) = seed(scope, "The support team is available on weekdays from 9 to 5")
    admin_client.post(f"/admin/memories/globalmemory/{fact.pk}/delete/", {"post": "yes"})
    assert not Fact.objects.exists()
    assert [c.action for c in FactChange.objects.order_by("created_at")] == ["add", "delete"]
