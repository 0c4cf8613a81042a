"""An operator in the admin, in headless Chromium: counters, a mismatch, Regenerate.

The Makefile's test target installs Debian's chromium and chromium-driver when
missing; only where that is impossible does this test skip, saying why.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from knowledge.models import Chunk
from tests.conftest import record
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


@pytest.fixture
def browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip(
            "Debian chromium/chromium-driver are not installed and could not be (scripts/ensure-chromium.sh)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="chromium-e2e-")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _row_cells(browser, name: str) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"):
        if name in row.text:
            return {
                cell.get_attribute("class").split()[0].removeprefix("field-"): cell.text
                for cell in row.find_elements(By.CSS_SELECTOR, "td, th")
                if cell.get_attribute("class")
            }
    raise AssertionError(f"no row for {name}")


def _messages(browser) -> str:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return "\n".join(ul.text for ul in browser.find_elements(By.CSS_SELECTOR, "ul.messagelist"))
    except StaleElementReferenceException:  # the page changed under us: ask again
        return ""


def test_operator_sees_mismatch_and_regenerates(browser, live_server, flow, memory_base):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    UserFactory(username="operator", is_staff=True, is_superuser=True, password="operator-pw")
    record(flow, "s1", "first answer", "second answer", "third answer")
    record(flow, "s2", "another", "and another", "and a third")

    browser.get(live_server.url + "/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("operator-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 30).until(lambda b: "/admin/login/" not in b.current_url)

    listing = live_server.url + "/admin/memory_bases/memorybase/"
    browser.get(listing)
    cells = _row_cells(browser, "support-memory")
    assert (cells["sessions_count"], cells["processed"], cells["chunks"], cells["pending"]) == (
        "2",
        "6",
        "6",
        "0",
    )
    assert cells["status"] == "ok"

    Chunk.objects.all().delete()  # someone wiped the vectors behind our back
    browser.get(listing)
    assert "Mismatch detected in support-memory" in _messages(browser)
    assert "Mismatch detected" in _row_cells(browser, "support-memory")["status"]
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "admin-memory-base-mismatch.png"))

    browser.find_element(By.CSS_SELECTOR, "#result_list tbody input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("regenerate")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    WebDriverWait(browser, 60).until(lambda b: "Regenerating" in _messages(b))

    assert "Regenerating: queued 2 job(s)." in _messages(browser)
    browser.get(listing)
    cells = _row_cells(browser, "support-memory")
    assert (cells["processed"], cells["chunks"], cells["status"]) == ("6", "6", "ok")
    assert "Mismatch" not in _messages(browser)
    assert Chunk.objects.count() == 6
    browser.save_screenshot(str(ARTIFACTS / "admin-memory-base-regenerated.png"))
