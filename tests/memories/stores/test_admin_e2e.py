"""An operator browses memory stores in the admin, in headless Chromium at 1440 px: the
stores with their types and item counts, a store's page with its node attachments, its
items, and a store deleted with its items after a confirmation. Screenshots land in
test-artifacts/."""

from __future__ import annotations

import pytest

from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.runtime import node_memory_write
from tests.browser import fits_the_window, login, messages, row_cells, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_operator_browses_stores_items_and_deletes_a_store(browser, live_server, alice, flow):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    memory_config_apply(
        owner=alice,
        document={
            "memory": [
                {"name": "notes", "type": "simple", "config": {"max_items": 100}},
                {"name": "log", "type": "blackboard", "config": {"max_items": 2}},
            ],
            "nodes": [
                {
                    "id": "writer",
                    "flow": flow.name,
                    "memories": [
                        {"name": "notes", "retrieve_stage": ["gen"], "top_k": 5},
                        {"name": "log"},
                    ],
                }
            ],
        },
    )
    for n in range(3):
        node_memory_write(
            flow=flow,
            node_id="writer",
            input=f"How do I rotate the API key number {n}?",
            output=f"Open the settings page and press Rotate; key {n} stops working at once.",
        )
    login(browser, live_server)

    listing = live_server.url + "/admin/memory_stores/memorystore/"
    browser.get(listing)
    notes, log = row_cells(browser, "notes"), row_cells(browser, "log")
    assert (notes["type"], notes["item_count"], notes["owner"]) == ("simple", "3", "alice")
    assert (log["type"], log["item_count"]) == ("blackboard", "2")  # trimmed to max_items
    assert fits_the_window(browser, "td.field-item_count")
    shot(browser, "admin-memory-store-list")

    browser.find_element(By.LINK_TEXT, "notes").click()
    WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".inline-group"))
    attachments = browser.find_element(By.CSS_SELECTOR, ".inline-group").text
    assert "node writer -> store notes" in attachments and flow.name in attachments
    assert fits_the_window(browser, ".inline-group")
    shot(browser, "admin-memory-store-change")

    store = MemoryStore.objects.get(name="notes")
    browser.get(f"{live_server.url}/admin/memory_stores/memoryitem/?store__id__exact={store.pk}")
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 3
    assert "rotate the API key number 2" in rows[0].text  # newest first
    assert fits_the_window(browser, "#result_list")
    shot(browser, "admin-memory-item-list")

    # Delete from the list asks first, saying what goes with the store.
    browser.get(listing)
    for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"):
        if "notes" in row.text:
            row.find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("delete_with_items")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    WebDriverWait(browser, 30).until(lambda b: "Delete these memory stores?" in b.page_source)
    assert "detach them from every agent node" in browser.page_source
    assert MemoryStore.objects.filter(name="notes").exists()  # nothing gone yet
    shot(browser, "admin-memory-store-delete-confirm")
    browser.find_element(By.CSS_SELECTOR, "input.confirm-yes").click()
    WebDriverWait(browser, 30).until(lambda b: "deleted notes" in messages(b))
    assert list(MemoryStore.objects.values_list("name", flat=True)) == ["log"]
    assert not MemoryItem.objects.filter(store__name="notes").exists()
    assert list(MemoryAttachment.objects.values_list("store__name", flat=True)) == ["log"]
    assert MemoryItem.objects.filter(store__name="log").count() == 2
