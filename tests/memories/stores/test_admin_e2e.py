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
    shot(browser, "admin-memory-store-change")
    assert fits_the_window(browser, ".inline-group")

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


def test_operator_adds_a_file_store_with_an_attachment_through_the_form(
    browser, live_server, alice, flow, docs_root
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    login(browser, live_server)
    browser.get(live_server.url + "/admin/memory_stores/memorystore/add/")
    # The owner is chosen by username (autocomplete).
    browser.find_element(By.CSS_SELECTOR, ".field-owner .select2-selection").click()
    search = browser.find_element(By.CSS_SELECTOR, ".select2-search__field")
    search.send_keys("alice")
    WebDriverWait(browser, 30).until(
        lambda b: "alice" in b.find_element(By.CSS_SELECTOR, ".select2-results").text
    )
    search.send_keys(Keys.ENTER)
    browser.find_element(By.NAME, "name").send_keys("project_docs")
    Select(browser.find_element(By.NAME, "type")).select_by_value("file")
    config = browser.find_element(By.NAME, "config")
    config.send_keys("file_sources:\n  - path: docs\n    file_types: [.md, .mdx]\n")
    browser.find_element(By.CSS_SELECTOR, ".add-row a").click()
    row = "attachments-0"
    Select(browser.find_element(By.NAME, f"{row}-flow")).select_by_visible_text(
        f"{flow.name} (alice)"
    )
    browser.find_element(By.NAME, f"{row}-node_id").send_keys("answer")
    browser.find_element(By.CSS_SELECTOR, f"input[name={row}-retrieve_stage][value=gen]").click()
    top_k = browser.find_element(By.NAME, f"{row}-top_k")
    top_k.clear()
    top_k.send_keys("4")
    shot(browser, "admin-memory-store-add")
    assert fits_the_window(browser, ".inline-group", ".field-config")

    # The write box is ticked by default: a file store is read-only, the row says so.
    browser.find_element(By.CSS_SELECTOR, "input[name=_save]").click()
    WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".errornote"))
    error = browser.find_element(By.CSS_SELECTOR, f"#{row} .errorlist")
    assert error.text == "store 'project_docs' is read-only: set write: false"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", error)
    assert not MemoryStore.objects.exists()
    shot(browser, "admin-memory-store-add-refused")
    assert fits_the_window(browser, ".inline-group")

    browser.find_element(By.NAME, f"{row}-write").click()  # untick
    browser.find_element(By.CSS_SELECTOR, "input[name=_continue]").click()
    WebDriverWait(browser, 30).until(lambda b: "loaded project_docs" in messages(b))
    assert "files 3 added" in messages(browser)
    store = MemoryStore.objects.get(name="project_docs")
    assert (store.owner, store.type, store.knowledge_base.chunk_count) == (alice, "file", 3)
    attachment = MemoryAttachment.objects.get(store=store)
    assert (attachment.node_id, attachment.retrieve_stage, attachment.top_k, attachment.write) == (
        "answer",
        ["gen"],
        4,
        False,
    )
    assert "hashing/hashing-v1 (384 dims), from the service default" in browser.page_source
    shot(browser, "admin-memory-store-added")
    assert fits_the_window(browser, ".inline-group", ".field-config")
    inline = browser.find_element(By.CSS_SELECTOR, ".inline-group")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", inline)
    assert "node answer -> store project_docs" in inline.text
    shot(browser, "admin-memory-store-added-attachments")
