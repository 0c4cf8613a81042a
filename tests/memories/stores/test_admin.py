import pytest

from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.runtime import node_memory_write

pytestmark = pytest.mark.django_db


@pytest.fixture
def stores(alice, flow):
    memory_config_apply(
        owner=alice,
        document={
            "memory": [
                {"name": "notes", "type": "simple", "config": {}},
                {"name": "log", "type": "blackboard", "config": {}},
            ],
            "nodes": [
                {"id": "n1", "flow": flow.name, "memories": [{"name": "notes"}, {"name": "log"}]}
            ],
        },
    )
    for n in range(3):
        node_memory_write(
            flow=flow, node_id="n1", input=f"question {n}", output=f"A long enough answer {n}."
        )
    return {s.name: s for s in MemoryStore.objects.all()}


def test_admin_lists_stores_with_item_counts_and_browses_items(admin_client, stores):
    html = admin_client.get("/admin/memory_stores/memorystore/").content.decode()
    assert 'class="field-item_count">3<' in html and "notes" in html and "log" in html
    detail = admin_client.get(
        f"/admin/memory_stores/memorystore/{stores['notes'].pk}/change/"
    ).content.decode()
    assert "n1" in detail  # the attachment inline
    items = admin_client.get(
        f"/admin/memory_stores/memoryitem/?store__id__exact={stores['notes'].pk}"
    ).content.decode()
    assert "Input: question 2 Output: A long enough answer 2." in items
    item = MemoryItem.objects.filter(store=stores["notes"]).first()
    page = admin_client.get(f"/admin/memory_stores/memoryitem/{item.pk}/change/").content.decode()
    assert "A long enough answer" in page and "embedding" not in page.lower()


def test_admin_deletes_an_item_and_a_store_with_its_items(admin_client, stores):
    item = MemoryItem.objects.filter(store=stores["notes"]).first()
    response = admin_client.post(
        f"/admin/memory_stores/memoryitem/{item.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 302
    assert not MemoryItem.objects.filter(pk=item.pk).exists()
    chosen = {"action": "delete_with_items", "_selected_action": [str(stores["notes"].pk)]}
    asked = admin_client.post("/admin/memory_stores/memorystore/", chosen)
    assert asked.status_code == 200 and "Delete these memory stores?" in asked.content.decode()
    assert MemoryStore.objects.filter(name="notes").exists()  # only asked
    response = admin_client.post(
        "/admin/memory_stores/memorystore/", {**chosen, "confirmed": "yes"}
    )
    assert response.status_code == 302
    assert not MemoryStore.objects.filter(name="notes").exists()
    assert not MemoryItem.objects.filter(store_id=stores["notes"].pk).exists()
    assert list(MemoryAttachment.objects.values_list("store__name", flat=True)) == ["log"]
