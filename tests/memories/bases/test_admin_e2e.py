"""An operator in the admin, in headless Chromium at 1440 px: counters, a mismatch,
Regenerate from the change page (after a confirmation), one message per outcome, the
chunk browser. Screenshots of each page land in test-artifacts/.

The Makefile's test target installs Debian's chromium and chromium-driver when
missing; only where that is impossible does this test skip, saying why.
"""

from __future__ import annotations

import pytest

from knowledge.models import Chunk
from tests.browser import click_and_wait, fits_the_window, login, messages, row_cells, shot
from tests.conftest import record
from tests.knowledge.factories import ingest, make_kb

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_operator_sees_mismatch_and_regenerates(browser, live_server, flow, memory_base):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    record(flow, "s1", "first answer", "second answer", "third answer")
    record(flow, "s2", "another", "and another", "and a third")
    login(browser, live_server)

    listing = live_server.url + "/admin/memory_bases/memorybase/"
    browser.get(listing)
    cells = row_cells(browser, "support-memory")
    assert (cells["sessions_count"], cells["processed"], cells["chunks"], cells["pending"]) == (
        "2",
        "6",
        "6",
        "0",
    )
    assert (cells["owner"], cells["status"]) == ("alice", "ok")
    # At 1440 px the whole row, Last sync and Status included, is on screen.
    assert browser.execute_script("return window.innerWidth") == 1440
    assert fits_the_window(browser, "td.field-last_sync", "td.field-status")
    shot(browser, "admin-memory-base-list")

    Chunk.objects.all().delete()  # someone wiped the vectors behind our back
    browser.get(listing)
    assert "mismatch detected in support-memory" in messages(browser)
    assert "Mismatch" in row_cells(browser, "support-memory")["status"]
    assert row_cells(browser, "support-memory")["chunks"] == "0"
    assert fits_the_window(browser, "td.field-last_sync", "td.field-status")
    shot(browser, "admin-memory-base-mismatch")

    # The change page: counters, buttons, the sessions; Regenerate asks first.
    browser.find_element(By.LINK_TEXT, "support-memory").click()
    WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.ID, "regenerate"))
    counter = {
        label: browser.find_element(By.ID, f"counter-{label}").text
        for label in ("sessions", "pending", "processed", "chunks", "status")
    }
    assert counter == {
        "sessions": "2",
        "pending": "0",
        "processed": "6",
        "chunks": "0",
        "status": "⚠ Mismatch",
    }
    assert browser.find_element(By.ID, "sync-now").is_displayed()
    assert "alice" in browser.find_element(By.CSS_SELECTOR, "div.field-owner").text
    assert fits_the_window(browser, "#regenerate", "#sync-now")
    shot(browser, "admin-memory-base-change")
    sessions = browser.find_element(By.CSS_SELECTOR, ".inline-group")
    browser.execute_script("arguments[0].scrollIntoView()", sessions)
    # Each session whose chunks are gone says so (their regenerate restores them).
    assert "s1" in sessions.text and "s2" in sessions.text
    assert sessions.text.count("mismatch") == 2 and "synced" not in sessions.text
    shot(browser, "admin-memory-base-change-sessions")
    browser.execute_script("window.scrollTo(0, 0)")

    browser.find_element(By.ID, "regenerate").click()
    WebDriverWait(browser, 30).until(lambda b: "Regenerate this memory base?" in b.page_source)
    shot(browser, "admin-memory-base-regenerate-confirm")
    click_and_wait(browser, "input.confirm-yes", "regenerating")
    shown = messages(browser)
    assert "support-memory: regenerating, 2 jobs queued." in shown
    assert "job(s)" not in shown and "already has an active" not in shown
    assert browser.find_element(By.ID, "counter-chunks").text == "6"
    assert Chunk.objects.count() == 6
    shot(browser, "admin-memory-base-regenerated")

    click_and_wait(browser, "#sync-now", "nothing to sync")
    assert "support-memory: nothing to sync, no session has pending messages." in messages(browser)

    # A list action that deletes asks first, naming what goes.
    browser.get(listing)
    browser.find_element(By.CSS_SELECTOR, "#result_list tbody input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("delete_with_knowledge_base")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    WebDriverWait(browser, 30).until(lambda b: "Delete these memory bases?" in b.page_source)
    shot(browser, "admin-memory-base-delete-confirm")
    browser.find_element(By.LINK_TEXT, "No, take me back").click()
    WebDriverWait(browser, 30).until(lambda b: b.current_url.endswith("/memorybase/"))
    assert row_cells(browser, "support-memory")["chunks"] == "6"

    # The memory base's own knowledge base: no delete, and a note saying where to go.
    kb = memory_base.knowledge_base
    browser.get(f"{live_server.url}/admin/knowledge/knowledgebase/{kb.pk}/change/")
    assert "delete the memory base instead" in messages(browser)
    assert not browser.find_elements(By.CSS_SELECTOR, "a.deletelink")
    assert not browser.find_elements(By.NAME, "name")  # its memory base names it
    shot(browser, "admin-knowledge-base-of-memory-base")


def test_chunk_browser_is_readable_at_1440(browser, live_server, alice):
    from selenium.webdriver.common.by import By

    kb = make_kb(alice, name="handbook")
    sentence = "The support team answers tickets on weekdays and escalates outages at once. "
    ingest(kb, *[(f"doc-{i:03d}", f"Section {i}. " + sentence * 6) for i in range(100)])
    login(browser, live_server)
    browser.get(f"{live_server.url}/admin/knowledge/chunk/?knowledge_base__id__exact={kb.pk}")
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 100
    text_cell = browser.find_element(By.CSS_SELECTOR, "td.field-excerpt")
    assert text_cell.size["width"] >= 400  # was about 100 px
    assert text_cell.size["height"] <= 60  # two lines at most, the rest on the chunk's page
    height = browser.execute_script("return document.documentElement.scrollHeight")
    assert height < 7000  # 100 rows made a 17,312 px page
    assert fits_the_window(browser, "td.field-excerpt")
    shot(browser, "admin-chunk-browser")
    text_cell.find_element(By.XPATH, "..").find_element(By.CSS_SELECTOR, "th a").click()
    assert sentence * 6 in browser.find_element(By.CSS_SELECTOR, "div.field-text").text + " "
    shot(browser, "admin-chunk-detail")
