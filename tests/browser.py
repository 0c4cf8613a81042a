"""Headless Chromium for the admin's end-to-end tests: the ``browser`` fixture (import
it into a test module) and what those tests do with it: log in, read a result row, the
messages shown, check a page fits the window, save a screenshot to test-artifacts/.

The Makefile's test target installs Debian's chromium and chromium-driver when
missing; only where that is impossible do these tests skip, saying why.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.factories import UserFactory

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


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
        "--window-size=1440,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def row_cells(browser, name: str) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"):
        if name in row.text:
            return {
                cell.get_attribute("class").split()[0].removeprefix("field-"): cell.text
                for cell in row.find_elements(By.CSS_SELECTOR, "td, th")
                if cell.get_attribute("class")
            }
    raise AssertionError(f"no row for {name}")


def messages(browser) -> str:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:  # as rendered, lowercased (Django's own messages start with a capital)
        return "\n".join(
            ul.text for ul in browser.find_elements(By.CSS_SELECTOR, "ul.messagelist")
        ).lower()
    except StaleElementReferenceException:  # the page changed under us: ask again
        return ""


def shot(browser, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def fits_the_window(browser, *selectors: str) -> bool:
    """No horizontal scroll (of the page or of the result table's own scroller), and
    every element named is inside the window."""
    return browser.execute_script(
        """
        const width = window.innerWidth;
        if (document.documentElement.scrollWidth > width) return false;
        for (const box of document.querySelectorAll(".results")) {
            if (box.scrollWidth > box.clientWidth) return false;
        }
        return arguments[0].every(sel => [...document.querySelectorAll(sel)].every(
            el => el.getBoundingClientRect().right <= width));
        """,
        list(selectors),
    )


def login(browser, live_server) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    UserFactory(username="operator", is_staff=True, is_superuser=True, password="operator-pw")
    browser.get(live_server.url + "/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("operator-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 30).until(lambda b: "/admin/login/" not in b.current_url)


def click_and_wait(browser, selector: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.find_element(By.CSS_SELECTOR, selector).click()
    WebDriverWait(browser, 60).until(lambda b: text in messages(b))
