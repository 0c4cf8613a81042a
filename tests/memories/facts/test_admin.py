import pytest

from memories.facts.models import EndUser, Vector
from memories.facts.services import end_user_ensure, memory_add

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _embedder(fixture_embedder):
    return fixture_embedder


def test_end_user_page_shows_memories_audit_and_counters(admin_client, alice):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    memory_add(end_user=end_user, content="User plays the violin", reason="told us")
    listing = admin_client.get("/admin/memories/enduser/").content.decode()
    assert (
        "u1" in listing and "memory_total_count" in listing and "memory_additions_total" in listing
    )
    detail = admin_client.get(f"/admin/memories/enduser/{end_user.pk}/change/").content.decode()
    assert "User plays the violin" in detail
    assert "told us" in detail  # the audit trail inline
    assert "embedding" not in detail.lower()


def test_erase_action(admin_client, alice):
    end_user = end_user_ensure(owner=alice, external_id="u1")
    memory_add(end_user=end_user, content="User plays the violin")
    asked = admin_client.post(
        "/admin/memories/enduser/", {"action": "erase", "_selected_action": [end_user.pk]}
    )
    assert "Erase these end users?" in asked.content.decode()
    assert EndUser.objects.exists() and Vector.objects.exists()  # only asked so far
    admin_client.post(
        "/admin/memories/enduser/",
        {"action": "erase", "_selected_action": [end_user.pk], "confirmed": "yes"},
    )
    assert not EndUser.objects.exists() and not Vector.objects.exists()


def test_global_memory_created_through_admin_is_embedded(admin_client, alice):
    response = admin_client.post(
        "/admin/memories/globalmemory/add/",
        {"owner": alice.pk, "content": "The API rate limit is 100 requests per minute"},
        follow=True,
    )
    assert response.status_code == 200
    vector = Vector.objects.get()
    assert (vector.type, vector.owner, vector.dimensions) == ("global", alice, 384)
