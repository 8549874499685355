"""In headless Chromium: the "?" beside a figure opens its definition, scrolled to its heading;
screenshots of both documentation pages at 1280 px and 375 px go to test-artifacts/."""

from __future__ import annotations

import shutil

import pytest

from tests.dashboard.conftest import PASSWORD
from tests.dashboard.test_browser import CHROMIUM, shoot

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="no /usr/bin/chromium (make browser)"),
]


def test_the_question_mark_beside_replayed_opens_its_definition(browser, live_server,  # noqa: F811
                                                                 known_run, owner):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", owner.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    page.goto(f"{live_server.url}/p/alpha/runs/{known_run.run_id}/")
    page.click('th a.def[aria-label="Definition of replayed"]')
    page.wait_for_url(f"{live_server.url}/docs/definitions/#replayed")
    heading = page.locator("h3#replayed")
    assert heading.inner_text().startswith("Replayed")
    top = heading.evaluate("h => h.getBoundingClientRect().top")
    assert 0 <= top < 200, top  # scrolled to the definition, not left at the top of the page
    assert page.evaluate("getComputedStyle(document.querySelector('.docs-nav')).position") \
        == "sticky"
    page.evaluate("window.scrollTo(0, 0)")
    shoot(page, "docs-definitions")
    page.click(".docs-pages >> text=Wire contract, version 1")
    page.wait_for_url(f"{live_server.url}/docs/ingest-v1/")
    assert page.locator("h3#restore-plan").count() == 1
    shoot(page, "docs-ingest-v1")
