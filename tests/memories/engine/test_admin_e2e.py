"""An operator works the engine's tiers in the admin, in headless Chromium at 1440 px: a
scope's journal day shown, Dream now from the list, the dream's page, its undo after a
confirmation, the per-owner schedule switch. Screenshots land in test-artifacts/."""

from __future__ import annotations

import pytest
from django.utils import timezone

from ingestion.updates import updates_run
from memories.engine.models import Dream, EngineSettings
from memories.engine.updates import update_record
from memories.facts.models import Fact
from memories.facts.services import FactIn, fact_add
from tests.browser import fits_the_window, login, messages, row_cells, shot
from tests.memories.engine.scripted import EngineLLM, fact

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCOPE = ("user", "alice")


def _choose_action(browser, label: str, action: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"):
        if label in row.text:
            row.find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value(action)
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()


def test_operator_reads_the_journal_dreams_and_undoes(
    browser, live_server, alice, llm_settings, openai_server, engine_storage
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    openai_server.chat_fn = EngineLLM(
        {"I like green tea in the morning": [fact("User likes green tea in the morning")]},
        dream=lambda prompt: {
            "facts": [
                {
                    "content": "User drinks green tea every morning",
                    "category": "preference",
                    "confidence": 0.9,
                }
            ],
            "diary": "Merged the tea facts.",
        },  # fmt: skip
    )
    llm_settings.ENGINE_DREAM_MAX_DROP = 1.0
    fact_add(owner=alice, scope=SCOPE, facts=[FactIn("User uses vim", "behavior", 0.9)])
    update = update_record(
        owner=alice,
        scope=SCOPE,
        messages=[{"role": "user", "content": "I like green tea in the morning"}],
    )
    updates_run(scope_id=update.scope_id, force=True)
    today = timezone.now().date().isoformat()
    login(browser, live_server)

    scopes = live_server.url + "/admin/memory_engine/scopejournal/"
    browser.get(scopes)
    assert (row_cells(browser, "user/alice")["scope_path"],
            row_cells(browser, "user/alice")["owner"]) == ("user/alice", "alice")  # fmt: skip
    assert fits_the_window(browser, "#result_list")
    shot(browser, "admin-engine-scopes")

    browser.find_element(By.LINK_TEXT, "user/alice").click()
    WebDriverWait(browser, 30).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, "div.field-journal")
    )
    days = browser.find_element(By.CSS_SELECTOR, "div.field-journal div.readonly").text
    assert days == f"{today} · show · download"
    assert "- [0.90] User likes green tea in the morning (id: " in browser.find_element(
        By.CSS_SELECTOR, "div.field-memory_md").text  # rendered from the facts  # fmt: skip
    shot(browser, "admin-engine-scope-journal")
    browser.find_element(By.LINK_TEXT, "show").click()
    WebDriverWait(browser, 30).until(lambda b: "/journal/" in b.current_url)
    assert "- **user**: I like green tea in the morning" in browser.page_source
    shot(browser, "admin-engine-journal-day")

    # Dream now, from the list: one LLM call, the facts rewritten, MEMORY.md written.
    browser.get(scopes)
    _choose_action(browser, "alice", "dream_now")
    WebDriverWait(browser, 60).until(lambda b: "dream" in messages(b))
    assert "alice: dream" in messages(browser) and "changes" in messages(browser)
    shot(browser, "admin-engine-dreamed")
    dream = Dream.objects.get()
    assert sorted(Fact.objects.filter(owner=alice).values_list("content", flat=True)) == [
        "User drinks green tea every morning"
    ]
    browser.find_element(By.LINK_TEXT, "user/alice").click()
    WebDriverWait(browser, 30).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, "div.field-memory_md")
    )
    assert "User drinks green tea every morning" in browser.find_element(
        By.CSS_SELECTOR, "div.field-memory_md").text  # fmt: skip
    assert not browser.find_elements(By.NAME, "_save")  # a view: nothing to save here
    assert fits_the_window(browser, "div.field-memory_md")
    shot(browser, "admin-engine-scope-memory-md")

    browser.get(f"{live_server.url}/admin/memory_engine/dream/")
    assert row_cells(browser, "alice")["status"] == "Applied"
    assert fits_the_window(browser, "#result_list")
    shot(browser, "admin-engine-dream-list")
    _choose_action(browser, "alice", "undo")
    WebDriverWait(browser, 30).until(lambda b: "Undo these dreams?" in b.page_source)
    assert f"dream of user/alice on {today} (applied)" in browser.page_source
    dream.refresh_from_db()
    assert dream.status == Dream.Status.APPLIED  # only asked
    shot(browser, "admin-engine-undo-confirm")
    browser.find_element(By.CSS_SELECTOR, "input.confirm-yes").click()
    WebDriverWait(browser, 30).until(lambda b: f"undid dream {dream.pk}" in messages(b))
    dream.refresh_from_db()
    assert dream.status == Dream.Status.UNDONE
    assert sorted(Fact.objects.filter(owner=alice).values_list("content", flat=True)) == [
        "User likes green tea in the morning",
        "User uses vim",
    ]
    assert row_cells(browser, "alice")["status"] == "Undone"

    # A dream reads as a page, its changes and facts as tables; the engine's facts listed.
    browser.get(f"{live_server.url}/admin/memory_engine/dream/{dream.pk}/change/")
    WebDriverWait(browser, 30).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, "div.field-changes_table")
    )
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("Dream of user/alice on")
    assert (
        "ACTION BEFORE AFTER RESULT"
        in browser.find_element(By.CSS_SELECTOR, "div.field-changes_table").text
    )
    assert fits_the_window(browser, "div.field-changes_table", "div.field-facts_table")
    shot(browser, "admin-engine-dream-page")
    browser.get(f"{live_server.url}/admin/memory_engine/enginefact/")
    assert row_cells(browser, "User uses vim")["scope_label"] == "user/alice"
    assert fits_the_window(browser, "#result_list")
    shot(browser, "admin-engine-facts")

    # The per-owner switches (the daily dream, the chats' memory tools), edited in the list.
    EngineSettings.objects.get_or_create(owner=alice)
    browser.get(f"{live_server.url}/admin/memory_engine/enginesettings/")
    box = browser.find_element(By.CSS_SELECTOR, "#result_list input[name$='dream_schedule']")
    tools = browser.find_element(By.CSS_SELECTOR, "#result_list input[name$='memory_tools']")
    assert box.is_selected() and not tools.is_selected()
    box.click()
    tools.click()
    browser.find_element(By.CSS_SELECTOR, "input[name=_save]").click()
    WebDriverWait(browser, 30).until(lambda b: "successfully" in messages(b))
    saved = EngineSettings.objects.get(owner=alice)
    assert (saved.dream_schedule, saved.memory_tools) == (False, True)
    shot(browser, "admin-engine-settings")
