"""An operator reads the facts room in the admin, in headless Chromium at 1440 px: the
index's memory-formation table, the scopes with their fact counts, one scope's facts
and audit trail, the audit list. Screenshots land in test-artifacts/."""

from __future__ import annotations

import uuid

import pytest

from memories.engine.models import FormationRun
from memories.facts.scopes import scope_find
from memories.facts.selectors import fact_list
from memories.facts.services import FactIn, fact_add, fact_update
from tests.browser import fits_the_window, login, row_cells, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCOPE = ("user", "alice")


def test_operator_reads_a_scopes_facts_and_their_trail(browser, live_server, alice):
    from selenium.webdriver.common.by import By

    fact_add(owner=alice, scope=SCOPE, facts=[
        FactIn("User drinks green tea", "preference", 0.9),
        FactIn("User lives in Lisbon", "context", 0.8),
    ])  # fmt: skip
    scope = scope_find(owner=alice, scope=SCOPE)
    tea = next(f for f in fact_list(scope=scope) if "tea" in f.content)
    fact_update(owner=alice, fact_id=tea.pk, scope=SCOPE, content="User drinks oolong tea",
                reason="the user corrected it")  # fmt: skip
    FormationRun.objects.create(owner=alice, scope=scope, batch_id=uuid.uuid4(),
                                status="done", updates=1, facts_learned=2)  # fmt: skip
    FormationRun.objects.create(owner=alice, scope=scope, batch_id=uuid.uuid4(),
                                status="malformed", updates=1)  # fmt: skip
    login(browser, live_server)

    browser.get(live_server.url + "/admin/")
    health = browser.find_element(By.ID, "formation-health").text
    shot(browser, "admin-index-formation-health")
    assert fits_the_window(browser, "#formation-health")  # first on the page, not below the apps
    assert "MEMORY FORMATION, LAST 24 HOURS" in health  # (the caption is set in capitals)
    row = next(line for line in health.splitlines() if line.startswith("alice"))
    assert row.split()[:6] == ["alice", "degraded", "2", "1", "0", "50%"]

    browser.get(live_server.url + "/admin/memories/scope/")
    shot(browser, "admin-facts-scopes")
    cells = row_cells(browser, "user/alice")
    assert (cells["scope_path"], cells["memory_count"]) == (
        "user/alice",
        "2",
    )
    assert fits_the_window(browser, "#result_list")

    browser.get(live_server.url + f"/admin/memories/scope/{scope.pk}/change/")
    page = browser.find_element(By.ID, "content").text
    shot(browser, "admin-facts-scope")
    assert "User drinks oolong tea" in page and "User lives in Lisbon" in page
    assert "User drinks green tea" in page  # the trail keeps the replaced text
    assert "the user corrected it" in page

    browser.get(live_server.url + "/admin/memories/factchange/")
    shot(browser, "admin-facts-changes")
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    actions = sorted(row.find_element(By.CSS_SELECTOR, ".field-action").text for row in rows)
    assert actions == ["Add", "Add", "Update"]
